"""Point-cloud preprocessing: validate, subsample, centre and scale to the unit sphere; collate with padding."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from .collate import pad_stack

__all__ = ["collate_points", "example_points", "normalize_points", "preprocess_points"]


def normalize_points(points: torch.Tensor) -> torch.Tensor:
    """Centre xyz at the centroid and scale it into the unit sphere (other channels unchanged)."""
    xyz = points[:, :3] - points[:, :3].mean(0)
    scale = xyz.norm(dim=1).max().clamp_min(1e-12)
    return torch.cat([xyz / scale, points[:, 3:]], 1)


def preprocess_points(points, num_points: int | None = None, normalize: bool = True, seed: int | None = None) -> torch.Tensor:
    """``[P, 3 + F]`` array -> float tensor, optionally randomly subsampled to ``num_points`` and normalised.

    Raises:
        ValueError: for a wrong shape, non-finite values, or fewer points than ``num_points``.
    """
    t = torch.as_tensor(np.asarray(points), dtype=torch.float32) if not isinstance(points, torch.Tensor) else points.float()
    if t.dim() != 2 or t.shape[1] < 3:
        raise ValueError(f"a point cloud must be [P, 3 + F]; got shape {tuple(t.shape)}")
    if not bool(torch.isfinite(t).all()):
        raise ValueError("point cloud has non-finite values; expected finite coordinates")
    if num_points is not None:
        if t.shape[0] < num_points:
            raise ValueError(f"point cloud has {t.shape[0]} points; at least num_points={num_points} expected")
        g = torch.Generator().manual_seed(seed or 0)
        t = t[torch.randperm(t.shape[0], generator=g)[:num_points]]
    return normalize_points(t) if normalize else t


def collate_points(samples: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Pad clouds ``[P_i, C]`` -> ``{"points": [B, P, C], "num_points": [B]}``."""
    for i, s in enumerate(samples):
        if not isinstance(s, torch.Tensor) or s.dim() != 2:
            raise ValueError(f"point cloud sample {i} must be [P, C]; got {getattr(s, 'shape', type(s))}")
    points, n = pad_stack(samples, 0, 0.0)
    return {"points": points, "num_points": n}


def example_points(size: int, seed: int) -> torch.Tensor:
    """Points on a torus or a box surface (by seed) with small noise: 256 (size 0) or 512 (size 1) points."""
    g = torch.Generator().manual_seed(seed)
    n = (256, 512)[size]
    if seed % 2 == 0:
        u, v = torch.rand(n, generator=g) * 2 * math.pi, torch.rand(n, generator=g) * 2 * math.pi
        r = 0.35
        pts = torch.stack([(1 + r * torch.cos(v)) * torch.cos(u), (1 + r * torch.cos(v)) * torch.sin(u), r * torch.sin(v)], 1)
    else:
        pts = torch.rand(n, 3, generator=g) * 2 - 1
        face = torch.randint(0, 3, (n,), generator=g)
        pts[torch.arange(n), face] = torch.sign(pts[torch.arange(n), face]) * torch.tensor([1.0, 0.6, 0.4])[face]
    pts = pts + 0.01 * torch.randn(pts.shape, generator=g)
    return normalize_points(pts)
