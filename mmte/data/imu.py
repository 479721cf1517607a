"""IMU preprocessing: resample to the model's rate (torchaudio), standardise per axis, pad in collate."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from .collate import pad_stack

__all__ = ["collate_imu", "example_imu", "preprocess_imu"]


def preprocess_imu(recording, sample_rate: int | None = None, target_rate: int | None = None, mean=None, std=None) -> torch.Tensor:
    """``[T, C]`` samples -> float ``[T', C]`` resampled from ``sample_rate`` to ``target_rate`` with
    ``torchaudio.functional.resample`` and standardised by ``mean``/``std`` (per axis) when given."""
    t = torch.as_tensor(np.asarray(recording), dtype=torch.float32) if not isinstance(recording, torch.Tensor) else recording.float()
    if t.dim() != 2:
        raise ValueError(f"an IMU recording must be [T, C]; got shape {tuple(t.shape)}")
    if not bool(torch.isfinite(t).all()):
        raise ValueError("IMU recording holds NaN/inf; expected finite values")
    if target_rate is not None and sample_rate is not None and target_rate != sample_rate:
        import torchaudio

        t = torchaudio.functional.resample(t.t().contiguous(), int(sample_rate), int(target_rate)).t()
    if mean is not None and std is not None:
        t = (t - torch.as_tensor(mean, dtype=torch.float32)) / torch.as_tensor(std, dtype=torch.float32)
    return t.contiguous()


def collate_imu(samples: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Pad recordings ``[T_i, C]`` -> ``{"imu": [B, T, C], "lengths": [B]}``."""
    for i, s in enumerate(samples):
        if not isinstance(s, torch.Tensor) or s.dim() != 2:
            raise ValueError(f"IMU sample {i} must be [T, C]; got {getattr(s, 'shape', type(s))}")
    imu, lengths = pad_stack(samples, 0, 0.0)
    return {"imu": imu, "lengths": lengths}


def example_imu(size: int, seed: int, rate: int = 50) -> torch.Tensor:
    """Walking-like 6-axis data at 50 Hz: gravity + a gait cycle (~1.8 Hz) with harmonics on the
    accelerometer, matching rotations on the gyroscope, sensor noise; 2 s (size 0) or 4 s (size 1)."""
    g = torch.Generator().manual_seed(seed)
    n = (2, 4)[size] * rate
    t = torch.arange(n) / rate
    f = 1.6 + 0.4 * torch.rand((), generator=g)
    ph = 2 * math.pi * f * t
    acc = torch.stack([0.3 * torch.sin(ph), 0.2 * torch.sin(2 * ph + 0.5), 1.0 + 0.4 * torch.cos(2 * ph)], 1)
    gyr = torch.stack([0.5 * torch.cos(ph), 0.3 * torch.sin(ph + 1.0), 0.1 * torch.sin(2 * ph)], 1)
    x = torch.cat([acc, gyr], 1) + 0.02 * torch.randn(n, 6, generator=g)
    return x
