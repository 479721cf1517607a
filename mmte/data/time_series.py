"""Time-series preprocessing: CSV loading, chronological splits, standardisation and forecasting windows.

Splits follow the dataset's own convention when it is known, as the long-horizon forecasting literature
(Informer, Autoformer, PatchTST...) does: the ETT files (columns HUFL, HULL, MUFL, MULL, LUFL, LULL, OT)
use 12 / 4 / 4 months of 30 days for train / val / test, i.e. 8,640 / 2,880 / 2,880 hourly rows (ETTh1/2)
or four times as many 15-minute rows (ETTm1/2); which one is read from the timestamps' spacing, not
from the row count; rows after the 20 months are not used. Other series are cut by fractions
(0.7 / 0.1 / 0.2: the first 70 % for training, the last 20 % for test, the rest for validation).
See :func:`split_borders`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from .collate import stack_parts, stack_same

__all__ = [
    "ETT_COLUMNS",
    "ETT_HOURLY_BORDERS",
    "ETT_MINUTE_BORDERS",
    "collate_series",
    "example_series",
    "load_csv_series",
    "preprocess_series",
    "read_series",
    "row_spacing",
    "sliding_windows",
    "split_borders",
]

# The standard ETTh split: 12 / 4 / 4 months of hourly rows (train, val, test).
ETT_HOURLY_BORDERS = (0, 12 * 30 * 24, 16 * 30 * 24, 20 * 30 * 24)
# ETTm: the same months at 15-minute rows.
ETT_MINUTE_BORDERS = tuple(4 * b for b in ETT_HOURLY_BORDERS)
ETT_COLUMNS = ("HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT")


def _select_columns(df, columns: Sequence[str] | None, where: str):
    """``df`` restricted to ``columns`` in that order (None: all), or an error naming the missing ones."""
    if columns is None:
        return df
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"columns {missing} are not in {where}; it has {list(df.columns)}")
    return df[list(columns)]


def load_csv_series(path: str | os.PathLike, columns: Sequence[str] | None = None, time_column: str | None = "date") -> tuple[np.ndarray, list[str]]:
    """Read a CSV of numeric columns (e.g. ETTh1) -> (values ``[T, C]`` float32, column names)."""
    import pandas as pd

    df = pd.read_csv(path)
    if time_column is not None and time_column in df.columns:
        df = df.drop(columns=[time_column])
    df = _select_columns(df, columns, os.fspath(path))
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


def read_series(
    path: str | os.PathLike, columns: Sequence[str] | None = None, time_column: str | None = "date", option: str = "path"
) -> tuple[np.ndarray, list[str], np.ndarray | None]:
    """Read a CSV of a multivariate series -> ``(values [T, C] float32, column names, timestamps [T] or None)``.

    Args:
        path: the CSV file.
        columns: the series' columns (None: every column but ``time_column``).
        time_column: the timestamp column (parsed with pandas; None or absent: no timestamps).
        option: the option that named the file, for messages.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a listed column is absent, a value is not a finite number (naming row and column),
            or the file has no rows.
    """
    import pandas as pd

    p = os.fspath(path)
    if not os.path.isfile(p):
        raise FileNotFoundError(f"{option}: time-series CSV {p!r} not found; expected a CSV file with a {time_column!r} column and numeric columns")
    df = pd.read_csv(p, keep_default_na=False)  # cells such as "n/a" stay text, so a message can show them
    if len(df) == 0:
        raise ValueError(f"{option} {p!r} has a header but no rows; expected one row per time step")
    stamps = None
    if time_column is not None and time_column in df.columns:
        try:
            stamps = pd.to_datetime(df[time_column]).to_numpy()
        except (ValueError, TypeError) as e:
            raise ValueError(f"{option} {p!r}: column {time_column!r} does not parse as timestamps ({e}); set time_column to the timestamp column or null") from None
        df = df.drop(columns=[time_column])
    df = _select_columns(df, columns, p)
    vals = df.apply(pd.to_numeric, errors="coerce").to_numpy(dtype=np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(vals) | (np.abs(vals) > np.finfo(np.float32).max)  # beyond float32: it would become inf
    if bad.any():
        r, c = map(int, np.argwhere(bad)[0])
        raw = df.iloc[r, c]
        if isinstance(raw, str) and not raw.strip():
            desc = "the cell is empty"
        elif np.isfinite(vals[r, c]):
            desc = f"{vals[r, c]:g} is beyond float32's range (|x| <= 3.4e38)"
        else:
            desc = f"{raw!r} is not a finite number" if isinstance(raw, str) else f"{vals[r, c]:g} is not a finite number"
        raise ValueError(
            f"{option} {p!r} row {r} (line {r + 2}), column {df.columns[c]!r}: {desc}; "
            f"fill or drop such rows ({int(bad.sum())} cell(s) in all)"
        )
    return vals.astype(np.float32), [str(c) for c in df.columns], stamps


def row_spacing(stamps: np.ndarray | None) -> np.timedelta64 | None:
    """The most common step between consecutive timestamps (None without timestamps or with one row)."""
    if stamps is None or len(stamps) < 2:
        return None
    d = np.diff(stamps.astype("datetime64[s]")).astype(np.int64)
    vals, counts = np.unique(d, return_counts=True)
    return np.timedelta64(int(vals[counts.argmax()]), "s")


def split_borders(
    n: int,
    columns: Sequence[str],
    stamps: np.ndarray | None,
    split: str = "auto",
    fractions: Sequence[float] = (0.7, 0.1, 0.2),
    where: str = "the series",
) -> tuple[list[int], str]:
    """``[train_start, val_start, test_start, end]`` rows of a series and a one-line description.

    Args:
        n: rows in the series.
        columns: its columns (the ETT convention applies to ETT's columns under ``split="auto"``).
        stamps: its timestamps (tell hourly from 15-minute ETT files).
        split: ``auto`` (ETT's convention for ETT files, else fractions), ``ett`` or ``fractions``.
        fractions: train / val / test fractions (``int(f * n)`` rows each, as in the literature: test is
            the last ``int(f_test * n)`` rows, validation the rows between train and test when the
            fractions sum to 1).
        where: the file, named in messages.

    Raises:
        ValueError: an unknown ``split``; ETT's convention on a file whose spacing is neither 1 hour nor
            15 minutes, or that is shorter than the 20 months; bad fractions.
    """
    if split not in ("auto", "ett", "fractions"):
        raise ValueError(f"split must be 'auto', 'ett' or 'fractions'; got {split!r}")
    is_ett = split == "ett" or (split == "auto" and set(ETT_COLUMNS) <= set(columns))
    if is_ett:
        step = row_spacing(stamps)
        if step == np.timedelta64(1, "h"):
            borders, kind = list(ETT_HOURLY_BORDERS), "hourly"
        elif step == np.timedelta64(15, "m"):
            borders, kind = list(ETT_MINUTE_BORDERS), "15-minute"
        else:
            raise ValueError(
                f"ETT's split convention needs hourly or 15-minute rows; {where} has rows {step} apart (time_column absent?); "
                f"set split: fractions, or borders: [0, train_end, val_end, test_end]"
            )
        if n < borders[-1]:
            raise ValueError(
                f"ETT's {kind} split convention (12/4/4 months: borders {borders}) needs {borders[-1]} rows; {where} has {n}; "
                f"set split: fractions, or borders: [0, train_end, val_end, test_end]"
            )
        unused = f"; rows {borders[-1]}-{n - 1} are not used, as in the literature" if n > borders[-1] else ""
        return borders, f"ETT {kind} convention, 12/4/4 months: train rows 0-{borders[1] - 1}, val {borders[1]}-{borders[2] - 1}, test {borders[2]}-{borders[3] - 1}{unused}"
    if len(fractions) != 3 or any(not 0 <= f < 1 for f in fractions) or fractions[0] <= 0 or sum(fractions) > 1 + 1e-9:
        raise ValueError(f"fractions must be [train, val, test] in [0, 1) with train > 0 and a sum <= 1; got {list(fractions)}")
    f_train, f_val, f_test = fractions
    b1 = int(n * f_train)
    n_test = int(n * f_test)
    if abs(sum(fractions) - 1) < 1e-9:
        b2, b3 = n - n_test, n
    else:
        b2 = b1 + int(n * f_val)
        b3 = b2 + n_test
    unused = f"; rows {b3}-{n - 1} are not used" if b3 < n else ""
    return [0, b1, b2, b3], f"fractions {list(fractions)}: train rows 0-{b1 - 1}, val {b1}-{b2 - 1}, test {b2}-{b3 - 1}{unused}"


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


def collate_series(samples: Sequence[torch.Tensor | Mapping[str, torch.Tensor]]) -> torch.Tensor | dict[str, torch.Tensor]:
    """Stack equal-length series ``[L, C]`` -> ``[B, L, C]``; samples that are dicts (a series with its
    ``season``) are stacked key by key."""
    if samples and isinstance(samples[0], Mapping):
        return stack_parts(samples, "time series")
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
