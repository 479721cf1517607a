"""Rows of CSV / TSV / Parquet tables as tabular samples; the schema is :class:`mmte.data.tabular.TableSchema`."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ...data import datasets as mds
from ...data.splits import split_indices
from .base import SPLITS, MMTEDataModule

logger = logging.getLogger(__name__)

__all__ = ["TableDataModule"]


class TableDataModule(MMTEDataModule):
    """Rows of CSV / TSV / Parquet tables (or ``sklearn://wine``) as tabular samples.

    The training table is ``train`` (or ``path``); val/test come from their own files, from a
    ``split_column``, or from stratified fractions of the training table. Column types, numeric scaling,
    category vocabularies and the class map are fitted on the training split only
    (:class:`mmte.data.tabular.TableSchema`), saved with the model, and reused unchanged on every other
    file: a test file whose categories appear in another order gets the same codes.

    Args:
        path: the training table (CSV/TSV/Parquet file, a glob of them, or sklearn://wine|iris|breast_cancer); same as train.
        label_column: the target column (optional in predict files).
        numeric: numeric feature columns (None: inferred from the training split: columns whose every value is a number).
        categorical: categorical feature columns (None: inferred); when both lists are given only those columns are used.
        task: ``classification`` (labels become class ids) or ``regression``.
        train: the training table (file or glob; default: path).
        val: a validation table (file or glob); all its rows are used.
        test: a test table (file or glob) for mmte test; every row is scored once.
        predict: a table to predict on (file or glob) for mmte predict; label_column may be absent.
        split_column: a column of the training table saying each row's split (train, val/valid/validation, test); removed from the features.
        id_column: a column holding each row's id for prediction files (default: the row number); removed from the features.
        scaling: numeric scaling fitted on the training split: ``standard`` (mean/std), ``quantile`` (quantiles to normal scores), ``none``.
        unknown_category: a category the training split never had: ``missing`` (encoded as the column's missing value) or ``error``.
        bad_value: a value that is not a finite number in a numeric column: ``error`` (naming file, row and column) or ``missing``.
        missing_label: an empty or NaN label: ``error`` (naming file and row) or ``drop`` (skip the row, counted in a warning).
        missing_values: cell texts that mean missing, besides empty cells.
        batch_size: training rows per batch, or ``auto``: the power of two nearest to (training rows / 200), within [16, 1024] (about 200 steps an epoch; 256 for 40k rows), so the recipe needs no per-table tuning.
        **kwargs: :class:`MMTEDataModule` options.
    """

    _source_kinds = "file|glob"

    def __init__(
        self,
        path: str | None = None,
        label_column: str = "target",
        numeric: list[str] | None = None,
        categorical: list[str] | None = None,
        task: str = "classification",
        train: str | None = None,
        val: str | None = None,
        test: str | None = None,
        predict: str | None = None,
        split_column: str | None = None,
        id_column: str | None = None,
        scaling: str = "standard",
        unknown_category: str = "missing",
        bad_value: str = "error",
        missing_label: str = "error",
        missing_values: list[str] | None = None,
        batch_size: int | str = 64,
        **kwargs: Any,
    ):
        auto_batch = batch_size == "auto"
        if isinstance(batch_size, str) and not auto_batch:
            raise ValueError(f"batch_size must be a positive int or 'auto'; got {batch_size!r}")
        super().__init__(batch_size=64 if auto_batch else batch_size, **kwargs)
        from ...data.tabular import DEFAULT_MISSING, TableSchema

        if task not in ("classification", "regression"):
            raise ValueError(f"task must be 'classification' or 'regression'; got {task!r}")
        if missing_label not in ("error", "drop"):
            raise ValueError(f"missing_label must be 'error' or 'drop'; got {missing_label!r}")
        self.path, self.label_column, self.task = path, label_column, task
        self.numeric_cols, self.categorical_cols = numeric, categorical
        self.split_column, self.id_column, self.scaling = split_column, id_column, scaling
        self.unknown_category, self.bad_value, self.missing_label = unknown_category, bad_value, missing_label
        self.missing_values = list(DEFAULT_MISSING if missing_values is None else missing_values)
        TableSchema(scaling=scaling, unknown_category=unknown_category, bad_value=bad_value)  # validates the policies now
        self.sources = {"train": train if train is not None else path, "val": val, "test": test, "predict": predict}
        self._frames: dict[str, Any] = {}
        self._assign: dict[str, np.ndarray] | None = None
        if self.state_from is None:
            if self.sources["train"] is None:
                raise ValueError("TableDataModule needs a training table: set path or train (a CSV/TSV/Parquet file or glob)")
            self._check_columns(self._frame("train"), "train")
        for s in ("val", "test", "predict"):
            if self.sources[s] is not None and self.state_from is None:
                self._check_columns(self._frame(s), s)
        self._init_state()
        if auto_batch:
            self._auto_batch_size(kwargs.get("eval_batch_size") is None)

    def _auto_batch_size(self, set_eval: bool) -> None:
        """``batch_size: auto``: a power of two near training rows / 200, within [16, 1024]."""
        if self.state_from is not None:  # evaluating a checkpoint: no training, evaluation batches only
            n, self.batch_size = None, 256
        else:
            n = len(self._assignment()["train"]) if self.sources["train"] is not None else 0
            self.batch_size = int(min(1024, max(16, 2 ** round(math.log2(max(n, 1) / 200)))))
            logger.info("batch_size auto: %d for %d training rows (%d steps an epoch)", self.batch_size, n, math.ceil(n / self.batch_size))
        if set_eval:
            self.eval_batch_size = max(self.batch_size, 512)

    # ------------------------------------------------------------------------------- reading
    def _frame(self, split: str):
        """The raw table of a split's own source ('train': the training table)."""
        from ...data.tabular import read_frame

        src = self.sources[split]
        if src is None:
            raise ValueError(self.empty_message(split))
        if src not in self._frames:
            option = "train" if split == "train" and self.path is None else ("path" if split == "train" else split)
            self._frames[src] = read_frame(src, option)
        return self._frames[src]

    def _check_columns(self, frame, split: str) -> None:
        cols = [c for c in frame.columns if not str(c).startswith("__mmte")]
        need = [*(self.numeric_cols or []), *(self.categorical_cols or [])]
        if split != "predict":
            need.insert(0, self.label_column)
        if split == "train" and self.split_column:
            need.append(self.split_column)
        if self.id_column:
            need.append(self.id_column)
        missing = [c for c in dict.fromkeys(need) if c not in cols]
        if missing:
            where = self.sources[split]
            raise ValueError(f"{where} lacks column(s) {missing}; it has {cols}")

    def _features(self, frame) -> list[str]:
        drop = {self.label_column, self.split_column, self.id_column}
        return [c for c in frame.columns if c not in drop and not str(c).startswith("__mmte")]

    def _labels(self, frame, split: str) -> tuple[np.ndarray | None, np.ndarray]:
        """``(label strings or floats [N] or None when the column is absent, keep mask [N])``."""
        from ...data.tabular import _cell, _missing, _numbers, category_key, describe_row

        if self.label_column not in frame.columns:
            if split != "predict":
                raise ValueError(f"the {split} table {self.sources[split]!r} lacks the label column {self.label_column!r}")
            return None, np.ones(len(frame), dtype=bool)
        col = frame[self.label_column]
        miss = _missing(col, self.missing_values)
        keep = np.ones(len(frame), dtype=bool)
        if miss.any() and split != "predict":
            i = int(np.flatnonzero(miss)[0])
            if self.missing_label == "error":
                raise ValueError(
                    f"{split} {describe_row(frame, i)}, column {self.label_column!r}: the label is empty or NaN "
                    f"({int(miss.sum())} such row(s)); fill it, or set missing_label: drop to skip such rows"
                )
            logger.warning("%s: %d row(s) without a label are dropped (first: %s)", split, int(miss.sum()), describe_row(frame, i))
            keep = ~miss
        if self.task == "regression":
            vals, bad = _numbers(col, miss)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ValueError(f"{split} {describe_row(frame, i)}, column {self.label_column!r}: {_cell(col.iloc[i])} is not a number; a regression target must be one")
            return vals, keep
        return np.array([None if m else category_key(v) for v, m in zip(col.tolist(), miss)], dtype=object), keep

    def _assignment(self) -> dict[str, np.ndarray]:
        """Training-table row indices of train and of the val/test splits without their own source."""
        if self._assign is not None:
            return self._assign
        frame = self._frame("train")
        n = len(frame)
        out = {s: np.zeros(0, dtype=np.int64) for s in SPLITS}
        carve = [s for s in ("val", "test") if self.sources[s] is None]
        if self.split_column:
            from ...data.tabular import describe_row

            aliases = {"train": "train", "training": "train", "val": "val", "valid": "val", "validation": "val", "dev": "val", "test": "test"}
            raw = frame[self.split_column].astype(str).str.strip().str.lower().tolist()
            which = []
            for i, v in enumerate(raw):
                if v not in aliases:
                    raise ValueError(f"{describe_row(frame, i)}, split_column {self.split_column!r}: {frame[self.split_column].iloc[i]!r} is not a split; expected train, val (valid, validation, dev) or test")
                which.append(aliases[v])
            which = np.asarray(which)
            out["train"] = np.flatnonzero(which == "train")
            for s in carve:
                out[s] = np.flatnonzero(which == s)
                self._why_empty[s] = f"no row of {self.sources['train']!r} has {self.split_column} = {s}"
            self._why_empty["train"] = f"no row of {self.sources['train']!r} has {self.split_column} = train"
        else:
            vf = self.val_fraction if "val" in carve else 0.0
            tf = self.test_fraction if "test" in carve else 0.0
            labels, _ = self._labels(frame, "train")
            strat = [str(v) for v in labels] if self.task == "classification" else np.zeros(n)
            sp = split_indices(strat, vf, tf, self.seed)
            for s in SPLITS:
                out[s] = np.asarray(sp[s], dtype=np.int64)
            for s in carve:
                self._why_empty[s] = f"no {s} table or split_column is set and {s}_fraction is {getattr(self, f'{s}_fraction')}"
            self._why_empty["train"] = "the fractions leave no training row"
        self._assign = out
        return out

    def _carve_hint(self, split: str) -> str:
        return f", or set split_column / {split}_fraction to take it from the training table"

    # ---------------------------------------------------------------------------------- state
    def fit_state(self) -> dict[str, Any]:
        from ...data.tabular import TableSchema

        frame = self._frame("train")
        idx = self._assignment()["train"]
        train = frame.iloc[idx]
        labels, keep = self._labels(train, "train")
        train = train[keep]
        if len(train) == 0:
            raise ValueError(self.empty_message("train"))
        schema = TableSchema(self.numeric_cols, self.categorical_cols, self.scaling, self.unknown_category, self.bad_value, self.missing_values)
        schema.fit(train, self._features(frame))
        class_names = mds.sort_labels([str(v) for v in labels[keep]]) if self.task == "classification" else None
        return {"task": self.task, "label_column": self.label_column, "class_names": class_names, "schema": schema.state()}

    def apply_state(self, state: Mapping[str, Any]) -> None:
        from ...data.tabular import TableSchema

        for key, mine in (("task", self.task), ("label_column", self.label_column)):
            if state[key] != mine:
                raise ValueError(f"the checkpoint's model was trained with {key} {state[key]!r}; this run has {mine!r}; use the training recipe's value")
        super().apply_state(state)
        self.schema = TableSchema.from_state(state["schema"], unknown_category=self.unknown_category, bad_value=self.bad_value)
        self.numeric, self.categorical = list(self.schema.numeric), list(self.schema.categorical)
        self.datasets.clear()

    @property
    def model_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"tokenizers": {"tabular": {"num_numeric": len(self.numeric), "cardinalities": list(self.schema.cardinalities)}}}
        if self.task == "classification":
            info["num_classes"] = len(self.class_names)
        else:
            info["out_dim"] = 1
        return info

    # ---------------------------------------------------------------------------------- build
    def build_split(self, split: str) -> None:
        from ...data.tabular import FILE_COL, ROW_COL, collate_tabular, describe_row

        if split in ("val", "test") and self.sources[split] is None and not self.split_column and not getattr(self, f"{split}_fraction"):
            self._why_empty[split] = f"no {split} table or split_column is set and {split}_fraction is {getattr(self, f'{split}_fraction')}"
            self.datasets[split], self.names[split] = [], []
            return
        if split in SPLITS and (split == "train" or self.sources[split] is None):
            full = self._frame("train")
            frame = full.iloc[self._assignment()[split]]
        else:
            frame = self._frame(split)
        labels, keep = self._labels(frame, split)
        frame = frame[keep]
        labels = labels[keep] if labels is not None else None
        self.collates = {"tabular": collate_tabular}
        num, cat = self.schema.encode(frame, split) if len(frame) else (np.zeros((0, len(self.numeric)), np.float32), np.zeros((0, len(self.categorical)), np.int64))
        cols: dict[str, Any] = {"row": np.arange(len(frame)), "index": list(range(len(frame)))}
        key = "label" if self.task == "classification" else "target"
        if labels is not None:
            if self.task == "classification":
                index = {c: i for i, c in enumerate(self.class_names)}
                y = []
                unknown = 0
                for i, v in enumerate(labels):
                    k = index.get(v) if v is not None else None
                    if k is None and v is not None:
                        if split != "predict":
                            raise ValueError(
                                f"{split} {describe_row(frame, i)}, column {self.label_column!r}: label {v!r} is not a class of the training split "
                                f"({self.class_names}); remove the row, or train with that class"
                            )
                        unknown += 1
                    y.append(-1 if k is None else k)
                if unknown:
                    logger.warning("predict: %d row(s) have labels the model was not trained on; their target is left empty", unknown)
            else:
                y = [float(v) for v in labels]
            cols[key] = y
        ds = mds.arrays_dataset(cols.pop("row"), None, "row")
        for k, v in cols.items():
            ds = ds.add_column(k, v)
        parts = {"numeric": torch.from_numpy(num), "categorical": torch.from_numpy(cat)}
        parts = {k: v for k, v in parts.items() if v.shape[1] > 0}

        def row(r, parts=parts):
            return {k: v[int(r)] for k, v in parts.items()}

        self.datasets[split] = mds.lazy_preprocess(ds, {"tabular": ("row", row)}, (key, "index"))
        files = frame[FILE_COL].astype(str).tolist()
        rows = frame[ROW_COL].astype(int).tolist()
        if self.id_column:
            ids = frame[self.id_column].astype(str).tolist()
        elif len(set(files)) <= 1:
            ids = [str(r) for r in rows]
        else:
            ids = [f"{os.path.basename(f)}:{r}" for f, r in zip(files, rows)]
        self.names[split] = ids
        if len(set(files)) > 1:
            self.row_info[split] = {"file": [os.path.basename(f) for f in files], "row": rows}
        else:
            self.row_info[split] = {"row": rows} if self.id_column else {}
        if split == "predict":
            self._why_empty["predict"] = f"{self.sources['predict']!r} has no row"
