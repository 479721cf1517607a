"""A fixed seasonal cycle of a time series: each row's phase and the training rows' level per phase.

A cycle of ``period`` rows ``step_s`` seconds apart places every timestamp at a phase (phase 0 at the
Unix epoch, so the phase of a row depends on its time only, not on where a file starts). The *level*
is each channel's mean (standardised) value at each phase over the training rows; a forecaster takes
it out of its inputs and adds it back to its forecasts.
"""

from __future__ import annotations

import numpy as np

__all__ = ["cycle_rows", "duration_s", "fit_level", "level_at", "phases"]


def duration_s(text: str) -> float:
    """Seconds in a duration such as ``1D`` or ``24h`` (pandas offsets).

    Raises:
        ValueError: not a duration.
    """
    import pandas as pd

    try:
        return pd.Timedelta(text).total_seconds()
    except ValueError:
        raise ValueError(f"cycle {text!r} is not a duration; expected e.g. '1D', '24h', '7D' or a number of rows") from None


def cycle_rows(cycle: int | str, step_s: int, where: str) -> int:
    """A cycle (a number of rows, or a duration) in rows ``step_s`` seconds apart.

    Raises:
        ValueError: the duration is not a whole number (>= 2) of rows of ``where``.
    """
    if isinstance(cycle, int):
        return cycle
    period = duration_s(cycle) / step_s
    if period != int(period) or period < 2:
        raise ValueError(f"cycle {cycle!r} is {period:g} rows of {where}'s {step_s} s spacing; expected a whole number of rows >= 2")
    return int(period)


def phases(stamps: np.ndarray, step_s: int, period: int) -> np.ndarray:
    """Each timestamp's phase in a cycle of ``period`` rows ``step_s`` seconds apart (phase 0 at the Unix epoch)."""
    secs = np.asarray(stamps, "datetime64[s]").astype(np.int64)
    return (np.floor_divide(secs, step_s) % period).astype(np.int64)


def fit_level(z: np.ndarray, stamps: np.ndarray, step_s: int, period: int, where: str) -> np.ndarray:
    """The mean of ``z`` ``[N, C]`` per phase of the cycle: ``[period, C]``.

    Raises:
        ValueError: the rows do not cover every phase.
    """
    phase = phases(stamps, step_s, period)
    if len(np.unique(phase)) < period:
        raise ValueError(f"cycle of {period} rows: the training rows of {where} do not cover every phase of it; use a shorter cycle or a longer training part")
    return np.stack([z[phase == k].mean(0) for k in range(period)])


def level_at(level: np.ndarray, times: np.ndarray, step_s: int, period: int) -> np.ndarray:
    """The cycle's ``level`` ``[period, C]`` at ``times``: ``[len(times), C]``."""
    return np.asarray(level, np.float64)[phases(times, step_s, period)]
