"""Hyperspectral tokenizer: spectral band grouping (SpectralFormer's group-wise spectral embedding).

A cube ``[B, bands, p, p]`` (a pixel's ``p x p`` spatial neighbourhood with all its bands) becomes one
token per group of ``group_size`` adjacent bands, taken every ``group_stride`` bands (overlapping
when ``group_stride < group_size``; the cube is zero-padded at the end of the spectrum). Each group's
``group_size * p * p`` values are embedded by a shared Linear, plus a learned position embedding over
the group index (sliced), so any band count works; cubes with fewer real bands (``num_bands``) have
their trailing groups masked (a group is real when it is one of the ``num_groups(num_bands)`` groups
the cube would have unpadded). A cls token is prepended.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..data.hyperspectral import collate_cubes, example_cube, extract_patch
from .base import ModalityTokenizer, TokenSeq, prepend_cls
from .registry import register_modality

__all__ = ["HyperspectralTokenizer"]


@register_modality(
    "hyperspectral",
    preprocess=extract_patch,
    collate=collate_cubes,
    default_head={"name": "classification", "pool": "mean"},
    example=example_cube,
    example_config={"patch_size": 5, "group_size": 4, "group_stride": 2, "max_bands": 64},
    variable_length=True,
    description="cubes {cube [B, bands, p, p], num_bands [B]}: SpectralFormer band-group tokens, any band count",
)
class HyperspectralTokenizer(ModalityTokenizer):
    """Cubes ``[B, bands, p, p]`` -> ``[cls] + ceil(max(bands - g, 0) / s) + 1`` band-group tokens.

    Args:
        dim: token width.
        patch_size: spatial neighbourhood ``p`` (the cube's height and width).
        group_size: adjacent bands per token ``g``.
        group_stride: bands between groups ``s`` (``<= g``).
        max_bands: the most bands the position embedding covers.
        cls_token: prepend a learned cls token.
    """

    modality = "hyperspectral"

    def __init__(
        self,
        dim: int,
        patch_size: int = 7,
        group_size: int = 4,
        group_stride: int = 4,
        max_bands: int = 256,
        cls_token: bool = True,
        *,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__(dim)
        if not 1 <= group_stride <= group_size:
            raise ValueError(f"group_stride must be in [1, group_size={group_size}]; got {group_stride}")
        self.patch_size, self.group_size, self.group_stride, self.max_bands = patch_size, group_size, group_stride, max_bands
        kw = {"device": device, "dtype": params_dtype}
        self.proj = nn.Linear(group_size * patch_size * patch_size, dim, **kw)
        self.norm = nn.LayerNorm(dim, **kw)
        self.pos_embed = nn.Parameter(torch.empty(1, self.num_groups(max_bands), dim, **kw))
        self.cls_token = nn.Parameter(torch.empty(1, 1, dim, **kw)) if cls_token else None
        self.num_prefix_tokens = int(cls_token)
        if self.proj.weight.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        self.proj.reset_parameters()
        self.norm.reset_parameters()
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)

    def num_groups(self, bands: int) -> int:
        """``ceil(max(bands - g, 0) / s) + 1`` band groups."""
        return math.ceil(max(bands - self.group_size, 0) / self.group_stride) + 1

    def num_tokens(self, bands: int) -> int:
        return self.num_prefix_tokens + self.num_groups(bands)

    def forward(self, cube: torch.Tensor, num_bands: torch.Tensor | None = None) -> TokenSeq:
        """Args:
            cube: ``[B, bands, p, p]`` (padded along bands).
            num_bands: real bands per cube ``[B]`` (None: all).
        """
        p = self.patch_size
        if cube.dim() != 4 or tuple(cube.shape[-2:]) != (p, p):
            raise ValueError(f"hyperspectral tokenizer expects cubes [B, bands, {p}, {p}]; got shape {tuple(cube.shape)}")
        b, bands = cube.shape[:2]
        if bands > self.max_bands:
            raise ValueError(f"cube has {bands} bands; this tokenizer takes at most max_bands={self.max_bands}")
        if not bool(torch.isfinite(cube).all()):
            raise ValueError("hyperspectral cube holds NaN/inf; expected finite values")
        g = self.num_groups(bands)
        need = (g - 1) * self.group_stride + self.group_size
        x = cube.to(self.proj.weight.dtype)
        if need > bands:
            x = F.pad(x, (0, 0, 0, 0, 0, need - bands))
        groups = x.unfold(1, self.group_size, self.group_stride)  # [B, G, p, p, g]
        groups = groups.permute(0, 1, 4, 2, 3).flatten(2)  # [B, G, g*p*p]
        tokens = self.norm(self.proj(groups)) + self.pos_embed[:, :g]
        mask = None
        if num_bands is not None:
            if tuple(num_bands.shape) != (b,):
                raise ValueError(f"num_bands must be [B={b}]; got shape {tuple(num_bands.shape)}")
            nb = num_bands.to(x.device).long()
            if bool((nb < 1).any()) or bool((nb > bands).any()):
                raise ValueError(f"num_bands must be in [1, {bands}]; got {nb.tolist()}")
            real_groups = ((nb - self.group_size).clamp_min(0) + self.group_stride - 1) // self.group_stride + 1
            mask = torch.arange(g, device=x.device)[None] < real_groups[:, None]
        tokens, mask = prepend_cls(self.cls_token, tokens, mask)
        return TokenSeq(tokens, mask, self.num_prefix_tokens)
