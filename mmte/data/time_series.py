"""Time-series preprocessing: CSV loading, chronological splits, standardisation and forecasting windows."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
import torch

from .collate import stack_same

__all__ = ["ETT_HOURLY_BORDERS", "collate_series", "example_series", "load_csv_series", "preprocess_series", "sliding_windows"]

# The standard ETTh split: 12 / 4 / 4 months of hourly rows (train, val, test).
ETT_HOURLY_BORDERS = (0, 12 * 30 * 24, 16 * 30 * 24, 20 * 30 * 24)


def load_csv_series(path: str | os.PathLike, columns: Sequence[str] | None = None, time_column: str | None = "date") -> tuple[np.ndarray, list[str]]:
    """Read a CSV of numeric columns (e.g. ETTh1) -> (values ``[T, C]`` float32, column names)."""
    import pandas as pd

    df = pd.read_csv(path)
    if time_column is not None and time_column in df.columns:
        df = df.drop(columns=[time_column])
    if columns is not None:
        missing = [c for c in columns if c not in df.columns]
        if missing:
            raise ValueError(f"columns {missing} are not in {os.fspath(path)}; it has {list(df.columns)}")
        df = df[list(columns)]
    try:
        values = df.to_numpy(dtype=np.float64)
    except ValueError as e:
        from ..errors import DataError

        bad = next((c for c in df.columns if not pd.api.types.is_numeric_dtype(df[c])), None)
        raise DataError(f"{os.fspath(path)}: column {bad!r} is not numeric ({e})", "expected numeric columns besides the time column",
                        "select numeric columns with columns: [...] or set time_column") from None
    from .finite import check_finite_table

    check_finite_table(values, list(df.columns), os.fspath(path))
    return values.astype(np.float32), list(df.columns)


def preprocess_series(values, mean=None, std=None) -> torch.Tensor:
    """``[L, C]`` values -> float tensor, optionally standardised by given (train-split) statistics."""
    t = torch.as_tensor(np.asarray(values), dtype=torch.float32)
    if t.dim() == 1:
        t = t[:, None]
    if t.dim() != 2:
        raise ValueError(f"a series must be [L, C]; got shape {tuple(t.shape)}")
    if not bool(torch.isfinite(t).all()):
        raise ValueError("series holds NaN/inf; expected finite values")
    if mean is not None and std is not None:
        t = (t - torch.as_tensor(mean, dtype=torch.float32)) / torch.as_tensor(std, dtype=torch.float32)
    return t


def sliding_windows(series: torch.Tensor, input_len: int, horizon: int, step: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """All (input, future) window pairs of ``series`` ``[T, C]`` every ``step`` steps:
    ``x [W, input_len, C]``, ``y [W, horizon, C]``."""
    total = input_len + horizon
    if series.shape[0] < total:
        raise ValueError(f"series of length {series.shape[0]} is shorter than input_len + horizon = {total}")
    w = series.unfold(0, total, step).permute(0, 2, 1)  # [W, total, C]
    return w[:, :input_len].contiguous(), w[:, input_len:].contiguous()


def collate_series(samples: Sequence[torch.Tensor]) -> torch.Tensor:
    """Stack equal-length series ``[L, C]`` -> ``[B, L, C]``."""
    return stack_same(samples, "time series")


def example_series(size: int, seed: int, channels: int = 3) -> torch.Tensor:
    """Hourly load-like series: daily and weekly cycles, a trend and AR(1) noise; 64 (size 0) or
    96 (size 1) steps of ``channels`` correlated channels."""
    g = torch.Generator().manual_seed(seed)
    n = (64, 96)[size]
    t = torch.arange(n, dtype=torch.float32) + 24 * torch.randint(0, 7, (), generator=g)
    base = 2 * torch.sin(2 * math.pi * t / 24) + 0.7 * torch.sin(2 * math.pi * t / 168) + 0.01 * t
    noise = torch.zeros(n, channels)
    eps = 0.3 * torch.randn(n, channels, generator=g)
    for i in range(1, n):
        noise[i] = 0.8 * noise[i - 1] + eps[i]
    mix = 0.5 + torch.rand(channels, generator=g)
    return base[:, None] * mix + noise + 5 * torch.rand(channels, generator=g)
