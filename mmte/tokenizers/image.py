"""Image tokenizer: ViT patch embedding, cls/register tokens and a learned position embedding that is
resampled (bicubic) for other resolutions."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..data.image import collate_images, example_image, preprocess_image
from .base import ModalityTokenizer, TokenSeq
from .registry import register_modality

__all__ = ["ImageTokenizer", "patch_embed", "patch_grid", "resample_pos_embed"]


def _pair(x: int | tuple[int, int], name: str = "patch_size") -> tuple[int, int]:
    p = (x, x) if isinstance(x, int) else (int(x[0]), int(x[1]))
    if p[0] < 1 or p[1] < 1:
        raise ValueError(f"{name} must be positive; got {x!r}")
    return p


def patch_grid(
    img_size: int | tuple[int, int], patch_size: int | tuple[int, int]
) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """``(img_size, patch_size, grid_size)`` as (h, w) pairs; ``ValueError`` when the image does not
    divide into whole patches."""
    img, patch = _pair(img_size, "img_size"), _pair(patch_size)
    if any(i % p for i, p in zip(img, patch)):
        raise ValueError(f"img_size {img} must be a multiple of patch_size {patch}")
    return img, patch, (img[0] // patch[0], img[1] // patch[1])


def resample_pos_embed(
    pos: torch.Tensor, new_grid: tuple[int, int], old_grid: tuple[int, int], num_prefix: int = 0
) -> torch.Tensor:
    """Resample a ``[1, prefix + Gh*Gw, D]`` position embedding to another patch grid.

    The prefix (cls/register) rows are kept; the grid rows are interpolated bicubically with
    anti-aliasing by timm's ``resample_abs_pos_embed`` (so converted timm models agree at any
    resolution). The same grid returns ``pos`` itself, in exported graphs too.
    """
    if tuple(new_grid) == tuple(old_grid):
        return pos
    from timm.layers import resample_abs_pos_embed  # on use: importing timm takes seconds

    return resample_abs_pos_embed(pos, list(new_grid), list(old_grid), num_prefix_tokens=num_prefix)


def patch_embed(proj: nn.Conv2d, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
    """``images [B, C, H, W]`` -> ``(tokens [B, gh*gw, D], (gh, gw))`` through the patch convolution ``proj``.

    Patches do not overlap (kernel = stride), so in eager inference (no autograd, not compiling or
    exporting, a plain ``nn.Conv2d`` with no hooks, a whole number of patches) this is the same GEMM as one
    ``F.linear`` over the flattened patches, which skips the convolution's setup (most of the cost for a few
    small images). Results agree to the summation order (3e-6 in fp32).
    """
    ph, pw = proj.kernel_size
    w = proj.weight
    hooks = nn.modules.module  # hooks registered for every module (register_module_forward_hook) see the call
    if (
        torch.is_grad_enabled() or torch.compiler.is_compiling() or torch.compiler.is_exporting()
        or type(proj) is not nn.Conv2d or proj._forward_hooks or proj._forward_pre_hooks
        or hooks._global_forward_hooks or hooks._global_forward_pre_hooks
        or tuple(proj.stride) != (ph, pw) or proj.padding != (0, 0) or proj.dilation != (1, 1) or proj.groups != 1
        or type(w) is not nn.Parameter or images.dtype != w.dtype
        or images.shape[-2] % ph or images.shape[-1] % pw  # a partial last patch: the convolution drops it
    ):
        x = proj(images)  # [B, D, gh, gw]
        return x.flatten(2).transpose(1, 2), tuple(x.shape[-2:])
    b, c, h, wd = images.shape
    gh, gw = h // ph, wd // pw
    patches = images.reshape(b, c, gh, ph, gw, pw).permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, c * ph * pw)
    return F.linear(patches, w.reshape(w.shape[0], -1), proj.bias), (gh, gw)


@register_modality(
    "image",
    preprocess=preprocess_image,
    collate=collate_images,
    default_head={"name": "classification", "pool": "cls"},
    example=example_image,
    example_config={"img_size": 32, "patch_size": 16},
    description="RGB images [B, 3, H, W]: ViT patch embedding, cls token, resampled position embedding",
)
class ImageTokenizer(ModalityTokenizer):
    """Images ``[B, C, H, W]`` -> patch tokens.

    Args:
        dim: token width.
        img_size: the resolution the position embedding is sized for.
        patch_size: square or (h, w) patch.
        in_chans: input channels (3 for RGB, 1 for infrared/X-ray variants).
        cls_token: prepend a learned cls token.
        num_reg_tokens: learned register tokens after the cls token.
        pos_embed: add a learned position embedding.
        no_embed_class: the position embedding covers only the patch grid (prefix tokens get none).
        patch_bias: bias in the patch convolution (CLIP has none).
        dynamic_img_size: accept other resolutions (multiples of the patch) by resampling positions.
    """

    modality = "image"

    def __init__(
        self,
        dim: int,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        *,
        cls_token: bool = True,
        num_reg_tokens: int = 0,
        pos_embed: bool = True,
        no_embed_class: bool = False,
        patch_bias: bool = True,
        dynamic_img_size: bool = True,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__(dim)
        self.img_size, self.patch_size, self.grid_size = patch_grid(img_size, patch_size)
        self.in_chans = in_chans
        self.no_embed_class = no_embed_class
        self.dynamic_img_size = dynamic_img_size
        kw = {"device": device, "dtype": params_dtype}
        self.proj = nn.Conv2d(in_chans, dim, self.patch_size, self.patch_size, bias=patch_bias, **kw)
        self.cls_token = nn.Parameter(torch.empty(1, 1, dim, **kw)) if cls_token else None
        self.reg_token = nn.Parameter(torch.empty(1, num_reg_tokens, dim, **kw)) if num_reg_tokens else None
        self.num_prefix_tokens = int(cls_token) + num_reg_tokens
        n_pos = self.grid_size[0] * self.grid_size[1] + (0 if no_embed_class else self.num_prefix_tokens)
        self.pos_embed = nn.Parameter(torch.empty(1, n_pos, dim, **kw)) if pos_embed else None
        if self.proj.weight.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        self.proj.reset_parameters()
        for p in (self.cls_token, self.reg_token):
            if p is not None:
                nn.init.normal_(p, std=1e-6)
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)

    def num_tokens(self, height: int, width: int) -> int:
        """Token count for an image of this size: prefix + (H/ph)*(W/pw)."""
        return self.num_prefix_tokens + (height // self.patch_size[0]) * (width // self.patch_size[1])

    def forward(self, images: torch.Tensor) -> TokenSeq:
        if images.dim() != 4 or images.shape[1] != self.in_chans:
            raise ValueError(
                f"{self.modality} tokenizer expects images [B, {self.in_chans}, H, W]; got shape {tuple(images.shape)}"
            )
        h, w = images.shape[-2:]
        if h % self.patch_size[0] or w % self.patch_size[1]:
            raise ValueError(f"image size {(h, w)} must be a multiple of patch_size {self.patch_size}")
        if (h, w) != self.img_size and not self.dynamic_img_size:
            raise ValueError(f"image size {(h, w)} differs from img_size {self.img_size} and dynamic_img_size=False")
        x, grid = patch_embed(self.proj, images)  # [B, gh*gw, D]
        b = x.shape[0]
        prefix = [t.expand(b, -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        if self.pos_embed is None:
            x = torch.cat(prefix + [x], 1)
        elif self.no_embed_class:
            x = x + resample_pos_embed(self.pos_embed, grid, self.grid_size, 0)
            x = torch.cat(prefix + [x], 1)
        else:
            x = torch.cat(prefix + [x], 1)
            x = x + resample_pos_embed(self.pos_embed, grid, self.grid_size, self.num_prefix_tokens)
        return TokenSeq(x, None, self.num_prefix_tokens, extras={"grid_size": grid})




def adapt_input_channels(weight: torch.Tensor, in_chans: int) -> torch.Tensor:
    """Adapt a pretrained patch-embedding weight ``[D, C, ...]`` to ``in_chans`` input channels.

    One channel: the sum over the RGB channels (a grey image ``g`` replicated to RGB gives the same
    output as the summed kernel applied to ``g``). Other counts: the kernel is tiled and rescaled by
    ``C / in_chans``. Both by timm's ``adapt_input_conv``.
    """
    if weight.dim() != 4:
        raise ValueError(f"adapting input channels needs a Conv2d patch weight [D, C, kh, kw]; got shape {tuple(weight.shape)}")
    from timm.models import adapt_input_conv  # on use: importing timm takes seconds

    return adapt_input_conv(in_chans, weight, base_chans=weight.shape[1])

