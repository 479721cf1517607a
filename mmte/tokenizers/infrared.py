"""Single-channel image modalities: infrared (thermal) and X-ray.

Both are :class:`ImageTokenizer` with one input channel. A pretrained RGB patch embedding (CLIP,
timm, Meta-Transformer) is adapted by summing its weights over the input channels
(:func:`adapt_input_channels`), so a grey image gives the same tokens as its RGB replica would give
the RGB tokenizer.
"""

from __future__ import annotations

from functools import partial

import torch

from ..data.image import collate_images, example_image, preprocess_image
from .image import ImageTokenizer, adapt_input_channels
from .registry import register_modality

__all__ = ["InfraredTokenizer", "XRayTokenizer"]


class _SingleChannelTokenizer(ImageTokenizer):
    def __init__(
        self,
        dim: int,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 1,
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
        super().__init__(
            dim,
            img_size,
            patch_size,
            in_chans,
            cls_token=cls_token,
            num_reg_tokens=num_reg_tokens,
            pos_embed=pos_embed,
            no_embed_class=no_embed_class,
            patch_bias=patch_bias,
            dynamic_img_size=dynamic_img_size,
            params_dtype=params_dtype,
            device=device,
        )

    @torch.no_grad()
    def load_rgb(self, rgb: ImageTokenizer | dict[str, torch.Tensor]) -> None:
        """Copy an RGB image tokenizer's weights (module or its state dict), summing the patch
        kernel over its input channels."""
        sd = dict(rgb.state_dict() if isinstance(rgb, torch.nn.Module) else rgb)
        if "proj.weight" not in sd:
            raise ValueError(f"expected an image tokenizer state dict with 'proj.weight'; got keys {sorted(sd)[:8]}")
        sd["proj.weight"] = adapt_input_channels(sd["proj.weight"], self.in_chans)
        own = self.state_dict()
        bad = {k: (tuple(v.shape), tuple(own[k].shape)) for k, v in sd.items() if k in own and v.shape != own[k].shape}
        if bad or set(sd) != set(own):
            raise ValueError(f"RGB tokenizer does not fit: shape mismatches {bad}, keys {sorted(set(sd) ^ set(own))}")
        self.load_state_dict(sd)


@register_modality(
    "infrared",
    preprocess=partial(preprocess_image, channels=1, mean=(0.5,), std=(0.25,)),
    collate=collate_images,
    default_head={"name": "classification", "pool": "cls"},
    example=partial(example_image, channels=1),
    example_config={"img_size": 32, "patch_size": 16},
    description="infrared images [B, 1, H, W]: single-channel ViT stem (RGB weights summed over channels)",
)
class InfraredTokenizer(_SingleChannelTokenizer):
    """Infrared / thermal images ``[B, 1, H, W]`` -> patch tokens (single-channel ViT stem)."""

    modality = "infrared"


@register_modality(
    "xray",
    preprocess=partial(preprocess_image, channels=1, mean=(0.5,), std=(0.25,)),
    collate=collate_images,
    default_head={"name": "classification", "pool": "cls"},
    example=partial(example_image, channels=1),
    example_config={"img_size": 32, "patch_size": 16},
    description="xray images [B, 1, H, W]: single-channel ViT stem (RGB weights summed over channels)",
)
class XRayTokenizer(_SingleChannelTokenizer):
    """X-ray images ``[B, 1, H, W]`` -> patch tokens (single-channel ViT stem)."""

    modality = "xray"
