"""Tabular preprocessing: rows -> standardised numeric values (NaN = missing) and categorical codes (-1 = missing)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .collate import stack_same

__all__ = ["TabularEncoder", "collate_tabular", "example_tabular"]


def _is_missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and v.strip() == "")


class TabularEncoder:
    """Fits column statistics on training rows and encodes rows for :class:`TabularTokenizer`.

    Rows are sequences (values in column order) or mappings (column name -> value). ``None``, NaN and
    ``""`` are missing; categories not seen in :meth:`fit` encode as missing.

    Args:
        numeric: numeric column positions (sequence rows) or names (mapping rows).
        categorical: categorical column positions or names.
        num_columns: row length for sequence rows (default: from the first row).
    """

    def __init__(self, numeric: Sequence[int | str] = (), categorical: Sequence[int | str] = (), num_columns: int | None = None):
        self.numeric, self.categorical, self.num_columns = list(numeric), list(categorical), num_columns
        if not self.numeric and not self.categorical:
            raise ValueError("TabularEncoder needs at least one numeric or categorical column")
        self.mean: np.ndarray | None = None
        self.std: np.ndarray | None = None
        self.vocab: list[dict[Any, int]] = []

    @property
    def cardinalities(self) -> tuple[int, ...]:
        return tuple(len(v) for v in self.vocab)

    def _check(self, rows: Sequence[Any]) -> None:
        if not rows:
            raise ValueError("no rows given")
        if isinstance(rows[0], Mapping):
            need = set(self.numeric) | set(self.categorical)
            for i, r in enumerate(rows):
                if not isinstance(r, Mapping):
                    raise ValueError(f"row {i} is a {type(r).__name__}; expected a mapping like row 0")
                missing = sorted(map(str, need - set(r)))
                if missing:
                    raise ValueError(f"row {i} lacks column(s) {missing}; expected columns {sorted(map(str, need))}")
            return
        n = self.num_columns if self.num_columns is not None else len(rows[0])
        self.num_columns = n
        for i, r in enumerate(rows):
            if isinstance(r, Mapping) or len(r) != n:
                raise ValueError(f"ragged tabular rows: row {i} has {len(r)} values; expected {n} values per row")
        hi = max([c for c in self.numeric + self.categorical if isinstance(c, int)], default=-1)
        if hi >= n:
            raise ValueError(f"column index {hi} is out of range for rows of {n} values")

    def _column(self, rows: Sequence[Any], c: int | str) -> list[Any]:
        return [r[c] for r in rows]

    def fit(self, rows: Sequence[Any]) -> TabularEncoder:
        """Numeric mean/std (ignoring missing) and categorical vocabularies (in first-seen order)."""
        self._check(rows)
        num = np.array([[np.nan if _is_missing(v) else float(v) for v in self._column(rows, c)] for c in self.numeric], dtype=np.float64)
        if self.numeric:
            self.mean = np.nanmean(num, 1)
            self.std = np.nanstd(num, 1)
            self.mean = np.nan_to_num(self.mean)
            self.std = np.where(np.isfinite(self.std) & (self.std > 0), self.std, 1.0)
        self.vocab = []
        for c in self.categorical:
            v: dict[Any, int] = {}
            for x in self._column(rows, c):
                if not _is_missing(x) and x not in v:
                    v[x] = len(v)
            self.vocab.append(v)
        return self

    def __call__(self, rows: Sequence[Any]) -> list[dict[str, torch.Tensor]]:
        """Encode rows -> one sample ``{"numeric": [Cn], "categorical": [Cc]}`` per row."""
        if self.numeric and self.mean is None or (self.categorical and not self.vocab):
            raise ValueError("TabularEncoder is not fitted; call fit(train_rows) first")
        self._check(rows)
        out = []
        for r in rows:
            s: dict[str, torch.Tensor] = {}
            if self.numeric:
                vals = np.array([np.nan if _is_missing(r[c]) else float(r[c]) for c in self.numeric])
                s["numeric"] = torch.tensor((vals - self.mean) / self.std, dtype=torch.float32)
            if self.categorical:
                s["categorical"] = torch.tensor([-1 if _is_missing(r[c]) else v.get(r[c], -1) for c, v in zip(self.categorical, self.vocab)], dtype=torch.long)
            out.append(s)
        return out


def collate_tabular(samples: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack encoded rows -> ``{"numeric": [B, Cn], "categorical": [B, Cc]}`` (keys present in the rows)."""
    if not samples:
        raise ValueError("cannot collate an empty list of tabular rows")
    keys = sorted(samples[0])
    for i, s in enumerate(samples):
        if sorted(s) != keys:
            raise ValueError(f"tabular row {i} has parts {sorted(s)}; expected {keys} like row 0")
    return {k: stack_same([s[k] for s in samples], f"tabular {k}") for k in keys}


def example_tabular(size: int, seed: int) -> dict[str, torch.Tensor]:
    """An iris flower as a table row: its 4 measurements (numeric; one missing for odd seeds) and two
    categorical columns (species of 3; petal-length bin of 5, missing every third seed). ``size`` 1
    picks rows from the end of the dataset and blanks a second measurement."""
    from sklearn.datasets import load_iris

    d = load_iris()
    i = (seed * 37 + (75 if size else 0)) % len(d.data)
    x = (d.data[i] - d.data.mean(0)) / d.data.std(0)
    num = torch.tensor(x, dtype=torch.float32)
    if seed % 2:
        num[seed % 4] = float("nan")
    if size:
        num[(seed + 1) % 4] = float("nan")
    petal_bin = int(np.digitize(d.data[i, 2], [2, 3.5, 4.5, 5.5]))
    cat = torch.tensor([int(d.target[i]), -1 if seed % 3 == 0 else petal_bin], dtype=torch.long)
    return {"numeric": num, "categorical": cat}
