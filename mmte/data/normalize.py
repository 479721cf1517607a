"""Standardisation statistics fitted on training data: per channel, per group, or over a stream.

The means and variances come from scikit-learn's ``StandardScaler`` (population variance, ``ddof=0``,
in float64). What is done with a zero or tiny spread is decided here, per use: a constant series
channel keeps scale 1, a group's mel bin is floored at ``1e-5``, a global fbank std at ``1e-6``
(``StandardScaler`` itself would put 1 wherever the spread is below machine precision).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

__all__ = ["channel_moments", "group_moments", "stream_moments"]


def _scaler(x: np.ndarray):
    from sklearn.preprocessing import StandardScaler

    return StandardScaler().fit(np.asarray(x, np.float64))


def channel_moments(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-column mean and std of ``x`` ``[N, C]``; a constant column gets std 1 (it is only centred)."""
    sc = _scaler(x)
    std = np.sqrt(sc.var_)
    return sc.mean_, np.where(std > 0, std, 1.0)


def group_moments(items: Sequence[Any], groups: Sequence[str], features: Callable[[Any], np.ndarray],
                  floor: float = 1e-5) -> dict[Any, tuple[np.ndarray, np.ndarray]]:
    """Per-group standardisation: item -> (mean [F], std [F]) over the rows of all ``features(item)``
    ``[T_i, F]`` of the items in its group (per-speaker CMVN); std is floored at ``floor``."""
    members: dict[str, list[Any]] = {}
    for item, g in zip(items, groups):
        members.setdefault(g, []).append(item)
    out: dict[Any, tuple[np.ndarray, np.ndarray]] = {}
    for its in members.values():
        sc = _scaler(np.concatenate([np.asarray(features(i), np.float64) for i in its], 0))
        mean, std = sc.mean_, np.maximum(np.sqrt(sc.var_), floor)
        out.update({i: (mean, std) for i in its})
    return out


def stream_moments(chunks: Iterable[np.ndarray], floor: float = 1e-6) -> tuple[float, float]:
    """Mean and std of every value of a stream of arrays (one scalar each; ``partial_fit``, so the
    stream is never held whole); std is floored at ``floor``."""
    from sklearn.preprocessing import StandardScaler

    sc = StandardScaler()
    for c in chunks:
        sc.partial_fit(np.asarray(c, np.float64).reshape(-1, 1))
    return float(sc.mean_[0]), float(max(np.sqrt(sc.var_[0]), floor))

