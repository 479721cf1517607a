"""Tabular preprocessing: rows -> standardised numeric values (NaN = missing) and categorical codes (-1 = missing).

Two encoders:

* :class:`TableSchema` (used by :class:`mmte.training.TableDataModule`): works on whole tables (pandas
  frames read as text, so types are decided here, not by the CSV reader). :meth:`TableSchema.fit` looks at
  the *training split only*: which columns are numeric (every non-missing value is a finite number) and
  which categorical, the numeric scaling (``standard``: mean/std; ``quantile``: the training quantiles
  mapped to normal scores; ``none``) and each categorical column's vocabulary (sorted, so files listing
  categories in another order map to the same codes). Its :meth:`~TableSchema.state` is plain lists and
  dicts, saved in checkpoints and reused by :meth:`TableSchema.from_state` on any later file, never refitted.
  Policies: a category the training split never had -> ``unknown_category`` (``missing``: code -1, the
  tokenizer's learned "missing" row; ``error``); a value that is not a number in a numeric column ->
  ``bad_value`` (``error`` naming file, row and column; ``missing``). Missing values (``missing_values``,
  empty cells, NaN) are NaN / -1.
* :class:`TabularEncoder` (the modality registry's preprocessing): fits on a list of rows.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .collate import stack_parts

__all__ = ["DEFAULT_MISSING", "TableSchema", "TabularEncoder", "collate_tabular", "example_tabular", "read_frame"]

logger = logging.getLogger(__name__)

# cell texts that mean "missing" (besides empty cells and NaN)
DEFAULT_MISSING = ("NA", "N/A", "NaN", "nan", "null", "NULL", "None")
FILE_COL, ROW_COL = "__mmte_file", "__mmte_row"  # where each row came from (for ids and messages)
FLOAT32_MAX = float(np.finfo(np.float32).max)


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
                    raise TypeError(f"row {i} is a {type(r).__name__}; expected a mapping like row 0")
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


# ----------------------------------------------------------------------------- whole tables
_TABLE_SUFFIXES = {".csv": "csv", ".tsv": "csv", ".parquet": "parquet", ".pq": "parquet"}


def read_frame(source: str | os.PathLike, option: str = "path"):
    """Read a table source as a pandas frame: a CSV/TSV (every cell as text, so :class:`TableSchema`
    decides the types), a Parquet file (typed), a folder or glob of such files (concatenated; their
    columns must agree), or ``sklearn://<wine|iris|breast_cancer>`` (scikit-learn's bundled tables, the
    label in column ``target``). Two extra columns record each row's file and row number.

    Raises:
        FileNotFoundError: naming ``option`` when the source does not exist.
        ValueError: an unsupported suffix, an empty table, or files whose columns differ.
    """
    import pandas as pd

    from .datasets import SKLEARN_DATASETS, list_files

    src = os.fspath(source)
    if src.startswith("sklearn://"):
        name = src[len("sklearn://") :]
        if name not in SKLEARN_DATASETS or name == "digits":
            raise ValueError(f"{option}: sklearn table must be one of {[n for n in SKLEARN_DATASETS if n != 'digits']}; got {name!r}")
        import sklearn.datasets as skd

        frame = getattr(skd, f"load_{name}")(as_frame=True).frame.reset_index(drop=True)
        frame[FILE_COL], frame[ROW_COL] = src, np.arange(len(frame))
        return frame
    paths, _ = list_files(src, "*", option)
    if os.path.isdir(src) or len(paths) > 1:
        paths = [p for p in paths if os.path.splitext(p)[1].lower() in _TABLE_SUFFIXES]
        if not paths:
            raise ValueError(f"{option} {src!r} holds no .csv, .tsv or .parquet file")
    frames = []
    for p in paths:
        kind = _TABLE_SUFFIXES.get(os.path.splitext(p)[1].lower())
        if kind is None:
            raise ValueError(f"{option} {p!r}: a table file must be .csv, .tsv or .parquet")
        if kind == "parquet":
            f = pd.read_parquet(p)
        else:
            f = pd.read_csv(p, sep="\t" if p.lower().endswith(".tsv") else ",", dtype=str, keep_default_na=False, na_filter=False)
        if len(f) == 0:
            raise ValueError(f"{option} {p!r} has a header but no rows; expected at least one data row")
        if frames and list(f.columns) != list(frames[0].columns)[:-2]:
            raise ValueError(f"{option}: {p!r} has columns {list(f.columns)}; expected {list(frames[0].columns)[:-2]} like {paths[0]!r}")
        f[FILE_COL], f[ROW_COL] = p, np.arange(len(f))
        frames.append(f)
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def describe_row(frame, i: int) -> str:
    """``file.csv row 17 (line 19)`` for the frame's ``i``-th row (a CSV's line counts the header)."""
    file, row = frame[FILE_COL].iloc[i], int(frame[ROW_COL].iloc[i])
    line = f" (line {row + 2})" if str(file).lower().endswith((".csv", ".tsv")) else ""
    return f"{os.path.basename(str(file))} row {row}{line}"


def _missing(col, missing_values: Sequence[str]) -> np.ndarray:
    import pandas as pd

    m = col.isna().to_numpy(dtype=bool)
    if col.dtype == object or pd.api.types.is_string_dtype(col.dtype):
        text = col.astype(str).str.strip()
        m = m | (text == "").to_numpy() | text.isin(list(missing_values)).to_numpy()
    return m


def _numbers(col, missing: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(float64 values with NaN where missing or bad, bad mask)``; bad = present but not a finite number."""
    import pandas as pd

    if col.dtype == bool:
        vals = col.to_numpy(dtype=np.float64)
    elif pd.api.types.is_numeric_dtype(col.dtype):
        vals = col.to_numpy(dtype=np.float64, na_value=np.nan)
    else:
        vals = pd.to_numeric(col.where(~missing, None).astype(object).map(lambda v: v.strip() if isinstance(v, str) else v), errors="coerce").to_numpy(dtype=np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~missing & (~np.isfinite(vals) | (np.abs(vals) > FLOAT32_MAX))  # beyond float32: it would become inf
    vals = np.where(missing | bad, np.nan, vals)
    return vals, bad


def _cell(v: Any) -> str:
    """A cell for messages: text quoted, numbers plain (``'12,5'``, ``inf``)."""
    if isinstance(v, np.generic):
        v = v.item()
    return repr(v) if isinstance(v, str) else str(v)


def _not_finite(cell: Any) -> str:
    """Why a numeric cell was refused, for messages."""
    try:
        x = float(str(cell).strip())
    except ValueError:
        return "is not a finite number"
    return "is beyond float32's range (|x| <= 3.4e38)" if math.isfinite(x) else "is not a finite number"


def _not_number(cell: Any) -> str:
    """Why a cell does not count as a number, for messages (text, or a float32-unsafe value)."""
    try:
        float(str(cell).strip())
    except ValueError:
        return "is not a number"
    return _not_finite(cell)


def category_key(v: Any) -> str:
    """A cell as a category name: text stripped, integral floats without ``.0`` (``3.0`` -> ``"3"``)."""
    if isinstance(v, (float, np.floating)) and math.isfinite(v) and float(v).is_integer():
        return str(int(v))
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    return str(v).strip()


def _normal_scores(x: np.ndarray, quantiles: np.ndarray) -> np.ndarray:
    """Map values to standard-normal scores through the training quantiles (``quantiles`` sorted,
    references evenly spaced in [0, 1]); ties between equal quantiles are averaged from both sides."""
    from scipy.special import ndtri

    refs = np.linspace(0.0, 1.0, len(quantiles))
    p = 0.5 * (np.interp(x, quantiles, refs) - np.interp(-x, -quantiles[::-1], -refs[::-1]))
    eps = 1e-7
    p = np.where(x <= quantiles[0], 0.0, np.where(x >= quantiles[-1], 1.0, p))
    return np.where(np.isnan(x), np.nan, ndtri(np.clip(p, eps, 1 - eps)))


class TableSchema:
    """Column types, scalers and vocabularies fitted on a training table; encodes any later table.

    Args:
        numeric: numeric feature columns (None: inferred from the training split).
        categorical: categorical feature columns (None: inferred).
        scaling: numeric scaling: ``standard`` (training mean/std), ``quantile`` (training quantiles ->
            normal scores, robust to skew and outliers), ``none``.
        unknown_category: a category the training split never had: ``missing`` (code -1) or ``error``.
        bad_value: a value that is not a finite number in a numeric column: ``error`` or ``missing``.
        missing_values: cell texts that mean missing (besides empty cells and NaN).
        max_quantiles: quantiles kept per column with ``scaling: quantile``.
    """

    SCALINGS = ("standard", "quantile", "none")

    def __init__(
        self,
        numeric: Sequence[str] | None = None,
        categorical: Sequence[str] | None = None,
        scaling: str = "standard",
        unknown_category: str = "missing",
        bad_value: str = "error",
        missing_values: Sequence[str] = DEFAULT_MISSING,
        max_quantiles: int = 1000,
    ):
        if scaling not in self.SCALINGS:
            raise ValueError(f"numeric scaling must be one of {self.SCALINGS}; got {scaling!r}")
        if unknown_category not in ("missing", "error"):
            raise ValueError(f"unknown_category must be 'missing' or 'error'; got {unknown_category!r}")
        if bad_value not in ("error", "missing"):
            raise ValueError(f"bad_value must be 'error' or 'missing'; got {bad_value!r}")
        self.numeric = None if numeric is None else list(numeric)
        self.categorical = None if categorical is None else list(categorical)
        self.scaling, self.unknown_category, self.bad_value = scaling, unknown_category, bad_value
        self.missing_values, self.max_quantiles = list(missing_values), int(max_quantiles)
        self.stats: dict[str, list[float]] = {}
        self.vocab: dict[str, list[str]] = {}
        self.fitted = False

    @property
    def cardinalities(self) -> list[int]:
        return [len(self.vocab[c]) for c in self.categorical or []]

    # ------------------------------------------------------------------------------- fitting
    def fit(self, frame, features: Sequence[str]) -> TableSchema:
        """Decide types and fit scalers/vocabularies on ``frame`` (the training split) over ``features``.

        Raises:
            ValueError: a column is numeric but for a few values (naming the first one's row), or a
                listed column is missing.
        """
        cols = list(features)
        listed = set(self.numeric or []) | set(self.categorical or [])
        missing_cols = sorted(listed - set(frame.columns))
        if missing_cols:
            raise ValueError(f"numeric/categorical name column(s) {missing_cols} that the table lacks; it has {[c for c in frame.columns if not c.startswith('__mmte')]}")
        both_listed = self.numeric is not None and self.categorical is not None
        numeric, categorical = [], []
        for c in cols:
            if c in (self.categorical or []):
                categorical.append(c)
            elif c in (self.numeric or []):
                numeric.append(c)
            elif not both_listed:  # infer from the training values
                miss = _missing(frame[c], self.missing_values)
                _, bad = _numbers(frame[c], miss)
                n_present, n_bad = int((~miss).sum()), int(bad.sum())
                if n_bad == 0:
                    numeric.append(c)
                elif n_bad <= 0.05 * n_present:  # a numeric column but for a few stray values
                    if self.bad_value == "error":
                        i = int(np.flatnonzero(bad)[0])
                        raise ValueError(
                            f"{describe_row(frame, i)}, column {c!r}: {_cell(frame[c].iloc[i])} {_not_number(frame[c].iloc[i])}, but {n_present - n_bad} of {n_present} "
                            f"training values are; fix the value, list {c!r} under categorical, or set bad_value: missing"
                        )
                    numeric.append(c)
                else:
                    categorical.append(c)
        if not numeric and not categorical:
            raise ValueError("the table has no feature columns besides the label; expected at least one numeric or categorical column")
        self.numeric, self.categorical = numeric, categorical
        self.stats, self.vocab = {}, {}
        for c in numeric:
            miss = _missing(frame[c], self.missing_values)
            vals, bad = _numbers(frame[c], miss)
            if bad.any() and self.bad_value == "error":
                i = int(np.flatnonzero(bad)[0])
                raise ValueError(f"{describe_row(frame, i)}, column {c!r}: {_cell(frame[c].iloc[i])} {_not_finite(frame[c].iloc[i])}; fix it or set bad_value: missing")
            present = vals[~np.isnan(vals)]
            if present.size == 0:
                logger.warning("column %r has no value in the training split; every row encodes it as missing", c)
            if self.scaling == "standard":
                mu = float(present.mean()) if present.size else 0.0
                sd = float(present.std()) if present.size else 1.0
                self.stats[c] = [mu, sd if math.isfinite(sd) and sd > 0 else 1.0]
            elif self.scaling == "quantile":
                nq = max(2, min(self.max_quantiles, present.size))
                q = np.quantile(present, np.linspace(0, 1, nq)) if present.size else np.array([0.0, 1.0])
                self.stats[c] = [float(v) for v in q]
        from .datasets import sort_labels

        for c in categorical:
            miss = _missing(frame[c], self.missing_values)
            keys = {category_key(v) for v, m in zip(frame[c].tolist(), miss) if not m}
            self.vocab[c] = sort_labels(sorted(keys))
        self.fitted = True
        logger.info(
            "table schema from the training split (%d rows): %d numeric (%s scaling), %d categorical column(s)%s",
            len(frame), len(numeric), self.scaling, len(categorical),
            (" (" + ", ".join(f"{c}: {len(self.vocab[c])}" for c in categorical) + " categories)") if categorical else "",
        )
        return self

    # ------------------------------------------------------------------------------ encoding
    def encode(self, frame, split: str = "data") -> tuple[np.ndarray, np.ndarray]:
        """``frame`` -> ``(numeric [N, Cn] float32 (NaN missing), categorical [N, Cc] int64 (-1 missing))``.

        Raises:
            ValueError: a feature column is missing, a numeric cell is not a number (``bad_value: error``)
                or a category is new (``unknown_category: error``), naming file, row and column.
        """
        if not self.fitted:
            raise ValueError("TableSchema is not fitted; call fit(train_frame, features) or from_state(...) first")
        need = [*self.numeric, *self.categorical]
        lacking = [c for c in need if c not in frame.columns]
        if lacking:
            raise ValueError(f"the {split} table lacks column(s) {lacking} that the model was trained with; it has {[c for c in frame.columns if not c.startswith('__mmte')]}")
        n = len(frame)
        num = np.empty((n, len(self.numeric)), dtype=np.float32)
        for j, c in enumerate(self.numeric):
            miss = _missing(frame[c], self.missing_values)
            vals, bad = _numbers(frame[c], miss)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                if self.bad_value == "error":
                    raise ValueError(
                        f"{split} {describe_row(frame, i)}, column {c!r}: {_cell(frame[c].iloc[i])} {_not_finite(frame[c].iloc[i])} (the column is numeric); "
                        f"fix it or set bad_value: missing"
                    )
                logger.warning("%s: %d value(s) of numeric column %r are not numbers and are treated as missing (first: %s)", split, int(bad.sum()), c, describe_row(frame, i))
            if self.scaling == "standard":
                mu, sd = self.stats[c]
                vals = (vals - mu) / sd
            elif self.scaling == "quantile":
                vals = _normal_scores(vals, np.asarray(self.stats[c], dtype=np.float64))
            num[:, j] = vals
        cat = np.empty((n, len(self.categorical)), dtype=np.int64)
        for j, c in enumerate(self.categorical):
            index = {k: i for i, k in enumerate(self.vocab[c])}
            miss = _missing(frame[c], self.missing_values)
            codes = np.full(n, -1, dtype=np.int64)
            unseen = []
            for i, (v, m) in enumerate(zip(frame[c].tolist(), miss)):
                if m:
                    continue
                k = index.get(category_key(v))
                if k is None:
                    unseen.append(i)
                else:
                    codes[i] = k
            if unseen:
                i = unseen[0]
                if self.unknown_category == "error":
                    known = self.vocab[c][:10]
                    raise ValueError(
                        f"{split} {describe_row(frame, i)}, column {c!r}: category {category_key(frame[c].iloc[i])!r} is not in the training split "
                        f"(known: {known}{' ...' if len(self.vocab[c]) > 10 else ''}); set unknown_category: missing to encode it as missing"
                    )
                logger.warning("%s: %d value(s) of column %r are categories the training split did not have; encoded as missing (first: %r at %s)",
                               split, len(unseen), c, category_key(frame[c].iloc[i]), describe_row(frame, i))
            cat[:, j] = codes
        return num, cat

    # --------------------------------------------------------------------------------- state
    def state(self) -> dict[str, Any]:
        """Plain lists/dicts (checkpoint-safe) from which :meth:`from_state` rebuilds the schema."""
        return {"numeric": list(self.numeric or []), "categorical": list(self.categorical or []), "scaling": self.scaling,
                "stats": {k: list(v) for k, v in self.stats.items()}, "vocab": {k: list(v) for k, v in self.vocab.items()},
                "unknown_category": self.unknown_category, "bad_value": self.bad_value, "missing_values": list(self.missing_values)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any], **policies: Any) -> TableSchema:
        """A fitted schema from :meth:`state`; ``policies`` (``unknown_category``, ``bad_value``) may override
        how later files are treated, never the fitted types, scalers or vocabularies."""
        s = cls(state["numeric"], state["categorical"], state["scaling"], policies.get("unknown_category", state["unknown_category"]),
                policies.get("bad_value", state["bad_value"]), state["missing_values"])
        s.stats = {k: list(v) for k, v in state["stats"].items()}
        s.vocab = {k: list(v) for k, v in state["vocab"].items()}
        s.fitted = True
        return s


def collate_tabular(samples: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack encoded rows -> ``{"numeric": [B, Cn], "categorical": [B, Cc]}`` (keys present in the rows)."""
    if not samples:
        raise ValueError("cannot collate an empty list of tabular rows")
    return stack_parts(samples, "tabular", "row")


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
