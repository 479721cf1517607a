"""Video tokenizer: tubelet embedding (a Conv3d over ``tubelet x patch x patch`` blocks, ViViT/VideoMAE).

Position = a spatial embedding over the patch grid (resampled for other resolutions, as images) plus
a temporal embedding over tubelet index (sliced, so padded clips keep their real tokens' positions).
Tokens are ordered time-major; a tubelet is real when all its frames are real. An image patch
embedding can be inflated into the tubelet kernel (:meth:`VideoTokenizer.inflate_from_image`).
"""

from __future__ import annotations

import torch
from torch import nn

from ..data.video import collate_video, example_video, preprocess_video
from .base import ModalityTokenizer, TokenSeq, prepend_cls
from .image import ImageTokenizer, patch_grid, resample_pos_embed
from .registry import register_modality

__all__ = ["VideoTokenizer"]


@register_modality(
    "video",
    preprocess=preprocess_video,
    collate=collate_video,
    default_head={"name": "classification", "pool": "mean"},
    example=example_video,
    example_config={"img_size": 32, "patch_size": 16, "max_frames": 8},
    variable_length=True,
    description="clips {video [B, C, T, H, W], frames [B]}: 2x16x16 tubelet Conv3d (image weights inflatable)",
)
class VideoTokenizer(ModalityTokenizer):
    """Clips ``[B, C, T, H, W]`` -> ``[cls] + (T/t) * (H/p) * (W/p)`` tubelet tokens.

    Args:
        dim: token width.
        img_size: frame resolution the spatial position embedding is sized for.
        patch_size: spatial patch.
        tubelet_size: frames per tubelet (2).
        in_chans: channels.
        max_frames: longest clip the temporal embedding covers.
        cls_token: prepend a learned cls token.
    """

    modality = "video"

    def __init__(
        self,
        dim: int,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        tubelet_size: int = 2,
        in_chans: int = 3,
        max_frames: int = 16,
        cls_token: bool = True,
        *,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__(dim)
        self.img_size, self.patch_size, self.grid_size = patch_grid(img_size, patch_size)
        if max_frames < tubelet_size:
            raise ValueError(f"max_frames ({max_frames}) must be >= tubelet_size ({tubelet_size})")
        self.tubelet_size, self.in_chans, self.max_frames = tubelet_size, in_chans, max_frames
        self.max_time = max_frames // tubelet_size
        kw = {"device": device, "dtype": params_dtype}
        k = (tubelet_size, *self.patch_size)
        self.proj = nn.Conv3d(in_chans, dim, k, k, **kw)
        self.cls_token = nn.Parameter(torch.empty(1, 1, dim, **kw)) if cls_token else None
        self.num_prefix_tokens = int(cls_token)
        self.pos_embed = nn.Parameter(torch.empty(1, self.grid_size[0] * self.grid_size[1], dim, **kw))
        self.time_embed = nn.Parameter(torch.empty(1, self.max_time, 1, dim, **kw))
        if self.proj.weight.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        self.proj.reset_parameters()
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.time_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)

    def num_tokens(self, frames: int, height: int, width: int) -> int:
        """``cls + (frames // t) * (H // p) * (W // p)``."""
        return self.num_prefix_tokens + (frames // self.tubelet_size) * (height // self.patch_size[0]) * (width // self.patch_size[1])

    @torch.no_grad()
    def inflate_from_image(self, image: ImageTokenizer | torch.Tensor, mode: str = "average") -> None:
        """Initialise the tubelet kernel from an image patch embedding ``[D, C, p, p]``.

        ``"average"`` spreads the kernel over the tubelet's frames (divided by ``t``), so a static clip
        gives the image's patch embedding; ``"center"`` puts it on the middle frame only. An
        :class:`ImageTokenizer` also provides its bias and spatial position embedding (resampled).
        """
        w = image.proj.weight if isinstance(image, ImageTokenizer) else image
        d, c = self.proj.weight.shape[:2]
        if w.dim() != 4 or tuple(w.shape) != (d, c, *self.patch_size):
            raise ValueError(f"image patch weight must be [{d}, {c}, {self.patch_size[0]}, {self.patch_size[1]}]; got {tuple(w.shape)}")
        t = self.tubelet_size
        if mode == "average":
            new = w[:, :, None].expand(-1, -1, t, -1, -1) / t
        elif mode == "center":
            new = torch.zeros_like(self.proj.weight)
            new[:, :, t // 2] = w
        else:
            raise ValueError(f"mode must be 'average' or 'center'; got {mode!r}")
        self.proj.weight.copy_(new)
        if isinstance(image, ImageTokenizer):
            if image.proj.bias is not None and self.proj.bias is not None:
                self.proj.bias.copy_(image.proj.bias)
            if image.pos_embed is not None:
                p = image.pos_embed if image.no_embed_class else image.pos_embed[:, image.num_prefix_tokens :]
                self.pos_embed.copy_(resample_pos_embed(p, self.grid_size, image.grid_size, 0))

    def forward(self, video: torch.Tensor, frames: torch.Tensor | None = None) -> TokenSeq:
        """Args:
            video: ``[B, C, T, H, W]`` (padded along T).
            frames: real frames per clip ``[B]`` (None: all).
        """
        if video.dim() != 5 or video.shape[1] != self.in_chans:
            raise ValueError(f"video tokenizer expects clips [B, {self.in_chans}, T, H, W]; got shape {tuple(video.shape)}")
        b, _, t, h, w = video.shape
        if t < self.tubelet_size or t > self.max_frames:
            raise ValueError(f"video has {t} frames; expected between tubelet_size={self.tubelet_size} and max_frames={self.max_frames}")
        if h % self.patch_size[0] or w % self.patch_size[1]:
            raise ValueError(f"frame size {(h, w)} must be a multiple of patch_size {self.patch_size}")
        x = self.proj(video.to(self.proj.weight.dtype))  # [B, D, T', gh, gw]
        tg, grid = x.shape[2], tuple(x.shape[-2:])
        x = x.flatten(3).permute(0, 2, 3, 1)  # [B, T', S, D]
        x = x + resample_pos_embed(self.pos_embed, grid, self.grid_size, 0)[:, None] + self.time_embed[:, :tg]
        s = x.shape[2]
        x = x.flatten(1, 2)
        mask = None
        if frames is not None:
            if tuple(frames.shape) != (b,):
                raise ValueError(f"frames must be [B={b}]; got shape {tuple(frames.shape)}")
            if bool((frames < self.tubelet_size).any()):
                raise ValueError(f"every clip needs >= tubelet_size={self.tubelet_size} frames; got frames {frames.tolist()}")
            real = (torch.arange(tg, device=x.device)[None] + 1) * self.tubelet_size <= frames[:, None].to(x.device)
            mask = real[:, :, None].expand(b, tg, s).flatten(1)
        x, mask = prepend_cls(self.cls_token, x, mask)
        return TokenSeq(x, mask, self.num_prefix_tokens, extras={"grid_size": (tg, *grid)})
