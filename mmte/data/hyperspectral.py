"""Hyperspectral preprocessing: per-band standardisation and pixel-centred spatial patches."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .collate import pad_stack

__all__ = ["collate_cubes", "example_cube", "extract_patch", "standardize_bands"]


def standardize_bands(image: torch.Tensor) -> torch.Tensor:
    """``[bands, H, W]`` -> each band standardised over the image."""
    m = image.mean((1, 2), keepdim=True)
    s = image.std((1, 2), keepdim=True).clamp_min(1e-6)
    return (image - m) / s


def extract_patch(image, row: int, col: int, patch_size: int = 7) -> torch.Tensor:
    """The ``patch_size x patch_size`` neighbourhood of pixel ``(row, col)`` of a ``[bands, H, W]``
    image (reflect-padded at the borders) -> ``[bands, p, p]``."""
    t = torch.as_tensor(np.asarray(image), dtype=torch.float32) if not isinstance(image, torch.Tensor) else image.float()
    if t.dim() != 3:
        raise ValueError(f"a hyperspectral image must be [bands, H, W]; got shape {tuple(t.shape)}")
    if patch_size % 2 == 0:
        raise ValueError(f"patch_size must be odd (a centred neighbourhood); got {patch_size}")
    _, h, w = t.shape
    if not (0 <= row < h and 0 <= col < w):
        raise ValueError(f"pixel ({row}, {col}) is outside the {h}x{w} image")
    r = patch_size // 2
    padded = F.pad(t[None], (r, r, r, r), mode="reflect" if min(h, w) > r else "replicate")[0]
    return padded[:, row : row + patch_size, col : col + patch_size].contiguous()


def collate_cubes(samples: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Pad cubes ``[bands_i, p, p]`` -> ``{"cube": [B, bands, p, p], "num_bands": [B]}``."""
    for i, s in enumerate(samples):
        if not isinstance(s, torch.Tensor) or s.dim() != 3:
            raise ValueError(f"hyperspectral sample {i} must be [bands, p, p]; got {getattr(s, 'shape', type(s))}")
    cube, n = pad_stack(samples, 0, 0.0)
    return {"cube": cube, "num_bands": n}


def example_cube(size: int, seed: int, patch_size: int = 5) -> torch.Tensor:
    """A ``patch_size``-pixel neighbourhood of a synthetic scene whose pixels mix vegetation-, soil-
    and water-like reflectance spectra (smooth curves over 400-1000 nm); 30 (size 0) or 48 (size 1) bands."""
    g = torch.Generator().manual_seed(seed)
    bands = (30, 48)[size]
    wl = torch.linspace(400, 1000, bands)
    veg = 0.05 + 0.45 / (1 + torch.exp(-(wl - 720) / 15)) + 0.06 * torch.exp(-(((wl - 550) / 30) ** 2))
    soil = 0.1 + 0.3 * (wl - 400) / 600
    water = 0.08 * torch.exp(-(wl - 400) / 150)
    ends = torch.stack([veg, soil, water])  # [3, bands]
    ab = torch.softmax(2 * torch.randn(3, patch_size, patch_size, generator=g), 0)
    cube = torch.einsum("kb,khw->bhw", ends, ab) + 0.005 * torch.randn(bands, patch_size, patch_size, generator=g)
    return (cube - 0.2) / 0.15
