"""LightningDataModules over :mod:`mmte.data.datasets` (Hugging Face ``datasets``).

Each DataModule builds raw-row datasets (file paths, table rows, arrays) and attaches the modality's
preprocessing from the modality registry lazily (``with_transform``, in the DataLoader workers) or,
with ``cache_dir``, once into an Arrow file reused by later runs. Batches are the model's format:
``{modality: collated value, "label" | "target": tensor, "index": row ids}``.

Everything that can be wrong with the inputs (a missing folder or file, a CSV without the named
columns, unreadable files) is checked when the DataModule is constructed, so the ``mmte`` command fails
with one line before anything is written. :attr:`MMTEDataModule.model_info` tells the model what the
data determines (classes, channels, horizon...); the CLI links it into ``model.data_info``.

Shuffling uses :class:`EpochSeededSampler` (a permutation of (seed, epoch)), so a run resumed from an
epoch-end checkpoint sees the same batches as an uninterrupted one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, DistributedSampler

from ..data import collate_batch
from ..data import datasets as mds
from ..tokenizers.registry import get_modality
from .guards import ResumableDataLoader

logger = logging.getLogger(__name__)

__all__ = [
    "ArrayDataModule",
    "EpochSeededSampler",
    "FolderDataModule",
    "ForecastDataModule",
    "MMTEDataModule",
    "PairedDataModule",
    "TableDataModule",
]

SPLITS = ("train", "val", "test")


class EpochSeededSampler(DistributedSampler):
    """A random permutation of ``range(n)`` drawn from ``(seed, epoch)``, sharded over data-parallel
    replicas; Lightning calls ``set_epoch``.

    Replica ``rank`` of ``num_replicas`` takes every ``num_replicas``-th index of the one global
    permutation (padded by wrapping around to a multiple of ``num_replicas``), so with a per-replica
    batch of ``B / num_replicas`` the replicas' batch ``k`` together are exactly batch ``k`` of one
    process with batch ``B``. Being a ``DistributedSampler``, Lightning uses it as is instead of
    wrapping it in its own (which would reshuffle).
    """

    def __init__(self, n: int, seed: int = 0, num_replicas: int = 1, rank: int = 0):
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, {num_replicas}); got {rank}")
        self.n, self.seed, self.epoch = n, seed, 0
        self.num_replicas, self.rank = num_replicas, rank
        self.num_samples = -(-n // num_replicas)
        self.total_size = self.num_samples * num_replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        perm = torch.randperm(self.n, generator=g).tolist()
        perm += perm[: self.total_size - self.n]
        return iter(perm[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples


def _preprocess_fn(
    modality: str, options: Mapping[str, Any] | None, min_frames: int | None = None, max_frames: int | None = None
) -> Callable[[Any], Any]:
    spec = get_modality(modality)
    if spec.preprocess is None:
        raise ValueError(f"modality {modality!r} has no preprocessing registered; give ready tensors instead")
    opts = dict(options or {})
    fn = partial(spec.preprocess, **opts)
    if modality != "audio" or not (min_frames or max_frames):
        return _as_array_input(fn, modality)

    def audio(path):
        fb = fn(path)
        if min_frames and fb.shape[0] < min_frames:  # very short clips: repeat the last frame up to one patch
            fb = torch.cat([fb, fb[-1:].expand(min_frames - fb.shape[0], -1)], 0)
        if max_frames and fb.shape[0] > max_frames:  # long clips: keep the first max_frames frames
            fb = fb[:max_frames]
        return fb

    return audio


def _as_array_input(fn: Callable[[Any], Any], modality: str) -> Callable[[Any], Any]:
    def call(value):
        if isinstance(value, list):  # Arrow hands nested lists back
            value = np.asarray(value, dtype=np.float32)
        return fn(value)

    return call


class MMTEDataModule(LightningDataModule):
    """Base class: splits, loaders, collate, ``model_info``.

    Args:
        batch_size: training batch size.
        eval_batch_size: validation/test/predict batch size (default: ``batch_size``).
        num_workers: DataLoader worker processes (0: load in the main process).
        seed: seed of the split and of the per-epoch shuffling.
        val_fraction, test_fraction: random stratified split fractions (where the data has no split).
        predict_split: the split ``mmte predict`` runs on.
        cache_dir: preprocess once into Arrow files here and reuse them (None: lazy, per item).
        drop_last: drop the last incomplete training batch.
    """

    def __init__(
        self,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
        val_fraction: float = 0.2,
        test_fraction: float = 0.0,
        predict_split: str = "val",
        cache_dir: str | None = None,
        drop_last: bool = False,
    ):
        super().__init__()
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int; got {batch_size!r}")
        if predict_split not in SPLITS:
            raise ValueError(f"predict_split must be one of {SPLITS}; got {predict_split!r}")
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an int >= 0; got {num_workers!r}")
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or batch_size
        self.num_workers, self.seed, self.drop_last = num_workers, seed, drop_last
        self.val_fraction, self.test_fraction, self.predict_split = val_fraction, test_fraction, predict_split
        self.cache_dir = cache_dir
        self.datasets: dict[str, Any] = {}
        self.names: dict[str, list[str]] = {}
        self.class_names: list[str] | None = None
        self.collates: dict[str, Callable] = {}

    # subclasses fill self.datasets (split -> dataset of preprocessed items), self.names, self.collates
    def build(self) -> None:
        raise NotImplementedError

    @property
    def model_info(self) -> dict[str, Any]:
        """What the model must agree with: ``num_classes`` etc. (linked to ``model.data_info``)."""
        return {"num_classes": len(self.class_names)} if self.class_names else {}

    def setup(self, stage: str | None = None) -> None:
        if not self.datasets:
            self.build()

    def _prepare(self, ds, fns: Mapping[str, tuple[str, Callable]], key: Any, keep: Sequence[str] = ("label", "index")):
        if self.cache_dir and len(ds) > 0:
            return mds.cached_preprocess(ds, fns, self.cache_dir, key, keep)
        return mds.lazy_preprocess(ds, fns, keep)

    def _collate(self, samples: list[Mapping[str, Any]]) -> dict[str, Any]:
        return collate_batch(samples, self.collates)

    def _loader(self, split: str, train: bool) -> DataLoader:
        self.setup()
        ds = self.datasets.get(split)
        if ds is None or len(ds) == 0:
            raise ValueError(f"the {split!r} split is empty; set val_fraction/test_fraction (or the split patterns) to make one")
        kw: dict[str, Any] = {"collate_fn": self._collate, "num_workers": self.num_workers, "persistent_workers": self.num_workers > 0}
        if train:
            shard = self._replicas()
            sampler = EpochSeededSampler(len(ds), self.seed, **shard)
            # resumable: a run stopped mid-epoch (SIGTERM) continues with the batches it had not seen yet
            return ResumableDataLoader(ds, batch_size=self.batch_size, sampler=sampler, drop_last=self.drop_last, **kw)
        return DataLoader(ds, batch_size=self.eval_batch_size, shuffle=False, **kw)

    def _replicas(self) -> dict[str, int]:
        """``{num_replicas, rank}`` of the data-parallel dimension (1, 0 without a distributed strategy;
        tensor- and pipeline-parallel ranks of one replica read the same data)."""
        strategy = getattr(self.trainer, "strategy", None) if self.trainer is not None else None
        kw = getattr(strategy, "distributed_sampler_kwargs", None) if getattr(strategy, "world_size", 1) > 1 else None
        if not kw:
            return {"num_replicas": 1, "rank": 0}
        return {"num_replicas": int(kw.get("num_replicas", 1)), "rank": int(kw.get("rank", 0))}

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.predict_split, False)

    def row_names(self, split: str) -> list[str]:
        """Human-readable ids of a split's rows (file names, row numbers), for prediction files."""
        self.setup()
        return self.names.get(split) or [str(i) for i in range(len(self.datasets[split]))]

    def _split_by_fraction(self, labels: Sequence[int]) -> dict[str, list[int]]:
        return mds.split_indices(labels, self.val_fraction, self.test_fraction, self.seed)


# --------------------------------------------------------------------------------------- arrays
class ArrayDataModule(MMTEDataModule):
    """In-memory arrays: one of scikit-learn's bundled datasets (``"digits"``: 1,797 8x8 images).

    Args:
        dataset: ``digits`` (images ``[8, 8]`` in [0, 1]), or ``iris``/``wine``/``breast_cancer``
            (feature vectors; use them with ``modality: tabular`` through :class:`TableDataModule`).
        modality: the batch key and the registry modality whose preprocessing is applied.
        preprocess: keyword arguments of that preprocessing (e.g. image ``size``, ``mean``, ``std``,
            ``channels``).
        **kwargs: :class:`MMTEDataModule` options.
    """

    def __init__(self, dataset: str = "digits", modality: str = "image", preprocess: dict[str, Any] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        if dataset not in mds.SKLEARN_DATASETS:
            raise ValueError(f"unknown dataset {dataset!r}; expected one of {mds.SKLEARN_DATASETS}")
        self.dataset, self.modality, self.preprocess = dataset, modality, dict(preprocess or {})
        self._fn = _preprocess_fn(modality, self.preprocess)  # validates the modality name now
        self._x, self._y, self.class_names = mds.sklearn_arrays(dataset)

    def build(self) -> None:
        split = self._split_by_fraction(self._y)
        fns = {self.modality: ("x", self._fn)}
        self.collates = {self.modality: get_modality(self.modality).collate_fn}
        for s, idx in split.items():
            ds = mds.arrays_dataset(self._x[idx], self._y[idx])
            ds = ds.add_column("index", list(idx))
            self.datasets[s] = self._prepare(ds, fns, (self.dataset, self.modality, self.preprocess, s, self.seed))
            self.names[s] = [f"{self.dataset}[{i}]" for i in idx]


# -------------------------------------------------------------------------------------- folders
class FolderDataModule(MMTEDataModule):
    """A folder of files (audio, images, ...) with labels from the file names or a CSV.

    Args:
        data_dir: the folder (searched recursively).
        modality: registry modality of the files (``audio``, ``image``, ``point_cloud``, ...).
        pattern: file-name glob (``"*.wav"``).
        label_regex: regular expression whose first group is the label (``"^(\\d+)_"`` for FSDD).
        labels_csv: alternatively a CSV with ``file_column`` and ``label_column``.
        file_column, label_column: the CSV's columns.
        val_regex, test_regex: files whose relative name matches go to val / test (e.g. FSDD's test
            split ``"_[0-4]\\.wav$"``); None: a random stratified split by the fractions.
        on_corrupt: ``"error"`` (stop with the file's name before training) or ``"skip"`` (drop
            unreadable files with one warning giving their count).
        preprocess: keyword arguments of the modality's preprocessing.
        min_frames: audio only: pad fbanks shorter than this (one patch) by repeating the last frame.
        max_frames: audio only: keep at most this many frames of a clip (None: all).
        **kwargs: :class:`MMTEDataModule` options.
    """

    def __init__(
        self,
        data_dir: str,
        modality: str = "audio",
        pattern: str = "*",
        label_regex: str | None = None,
        labels_csv: str | None = None,
        file_column: str = "file",
        label_column: str = "label",
        val_regex: str | None = None,
        test_regex: str | None = None,
        on_corrupt: str = "error",
        preprocess: dict[str, Any] | None = None,
        min_frames: int | None = 16,
        max_frames: int | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.modality, self.preprocess = modality, dict(preprocess or {})
        self._fn = _preprocess_fn(modality, self.preprocess, min_frames, max_frames)
        self.max_frames = max_frames
        self.data_dir, self.val_regex, self.test_regex = data_dir, val_regex, test_regex
        self.min_frames = min_frames
        ds, self.class_names = mds.files_dataset(
            data_dir, pattern, label_regex=label_regex, labels_csv=labels_csv, file_column=file_column, label_column=label_column
        )
        good = mds.check_files(ds["path"], modality, on_corrupt)
        n_all = len(ds)
        if len(good) < n_all:
            ds = ds.select(good)
        self.skipped = n_all - len(good)
        self._raw = ds.add_column("index", list(range(len(ds))))

    def split(self) -> dict[str, list[int]]:
        """Row indices of each split (by the regexes, else random and stratified)."""
        import re

        names, labels = self._raw["name"], self._raw["label"]
        if self.val_regex is None and self.test_regex is None:
            return self._split_by_fraction(labels)
        vr = re.compile(self.val_regex) if self.val_regex else None
        tr = re.compile(self.test_regex) if self.test_regex else None
        out: dict[str, list[int]] = {s: [] for s in SPLITS}
        for i, n in enumerate(names):
            if tr is not None and tr.search(n):
                out["test"].append(i)
            elif vr is not None and vr.search(n):
                out["val"].append(i)
            else:
                out["train"].append(i)
        return out

    def build(self) -> None:
        fns = {self.modality: ("path", self._fn)}
        self.collates = {self.modality: get_modality(self.modality).collate_fn}
        for s, idx in self.split().items():
            ds = self._raw.select(idx)
            self.datasets[s] = self._prepare(ds, fns, (self.modality, self.preprocess, self.min_frames, self.max_frames))
            self.names[s] = ds["name"]

    def split_dataset(self, split: str):
        """The preprocessed dataset of one split (used by :class:`PairedDataModule`)."""
        self.setup()
        return self.datasets[split]


# --------------------------------------------------------------------------------------- tables
class TableDataModule(MMTEDataModule):
    """Rows of a CSV / Parquet table (or ``sklearn://wine``) as tabular samples.

    Numeric columns are standardised with the training split's statistics, categorical ones coded
    from the training split's values (:class:`mmte.data.tabular.TabularEncoder`).

    Args:
        path: the table file.
        label_column: the target column.
        numeric: numeric feature columns (None: every numeric column except the label).
        categorical: categorical feature columns (None: every non-numeric column except the label).
        task: ``"classification"`` (labels become class ids) or ``"regression"``.
        **kwargs: :class:`MMTEDataModule` options.
    """

    def __init__(
        self,
        path: str,
        label_column: str = "target",
        numeric: list[str] | None = None,
        categorical: list[str] | None = None,
        task: str = "classification",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if task not in ("classification", "regression"):
            raise ValueError(f"task must be 'classification' or 'regression'; got {task!r}")
        self.path, self.label_column, self.task = path, label_column, task
        need = [label_column, *(numeric or []), *(categorical or [])]
        table = mds.read_table(path, need, self.cache_dir)
        cols = [c for c in table.column_names if c != label_column]
        feats = table.features
        is_num = {c: getattr(feats[c], "dtype", "") in ("int8", "int16", "int32", "int64", "float16", "float32", "float64", "bool") for c in cols}
        self.numeric = list(numeric) if numeric is not None else [c for c in cols if is_num[c] and c not in (categorical or [])]
        self.categorical = list(categorical) if categorical is not None else [c for c in cols if not is_num[c] and c not in self.numeric]
        if not self.numeric and not self.categorical:
            raise ValueError(f"table {path} has no feature columns besides {label_column!r}")
        labels = table[label_column]
        _check_table_values(table, self.numeric, label_column, task, path)
        if task == "classification":
            uniq = sorted(set(labels), key=lambda v: (str(type(v)), v))
            self.class_names = [str(u) for u in uniq]
            index = {u: i for i, u in enumerate(uniq)}
            y = [index[v] for v in labels]
        else:
            y = [float(v) for v in labels]
        self._table, self._y = table, y

    @property
    def model_info(self) -> dict[str, Any]:
        self.setup()
        info: dict[str, Any] = {"tokenizers": {"tabular": {"num_numeric": len(self.numeric), "cardinalities": list(self.encoder.cardinalities)}}}
        if self.task == "classification":
            info["num_classes"] = len(self.class_names)
        else:
            info["out_dim"] = 1
        return info

    def build(self) -> None:
        from ..data.tabular import TabularEncoder, collate_tabular

        split = self._split_by_fraction(self._y) if self.task == "classification" else mds.split_indices(
            np.zeros(len(self._y)), self.val_fraction, self.test_fraction, self.seed
        )
        rows = self._table.select_columns(self.numeric + self.categorical).to_list()
        self.encoder = TabularEncoder(self.numeric, self.categorical).fit([rows[i] for i in split["train"]])
        self.collates = {"tabular": collate_tabular}
        enc = self.encoder
        for s, idx in split.items():
            key = "label" if self.task == "classification" else "target"
            ds = mds.arrays_dataset(np.arange(len(idx)), None, "row").add_column(key, [self._y[i] for i in idx])
            ds = ds.add_column("index", list(idx))
            split_rows = [rows[i] for i in idx]
            self.datasets[s] = mds.lazy_preprocess(ds, {"tabular": ("row", lambda r, sr=split_rows: enc([sr[r]])[0])}, (key, "index"))
            self.names[s] = [f"row {i}" for i in idx]


def _check_table_values(table, numeric: list[str], label_column: str, task: str, path: str) -> None:
    """Numeric features finite and within float32 (empty = missing); every row labelled (a NaN or empty label
    would otherwise become a class of its own)."""
    from ..data.finite import check_finite_table
    from ..errors import DataError

    if numeric:
        cols = [np.asarray([np.nan if v is None else v for v in table[c]], dtype=np.float64) for c in numeric]
        check_finite_table(np.stack(cols, 1), numeric, f"table {path}", allow_nan=True)
    labels = table[label_column]
    missing = [i for i, v in enumerate(labels) if v is None or (isinstance(v, float) and not np.isfinite(v)) or (isinstance(v, str) and not v.strip())]
    if missing:
        raise DataError(f"table {path}: row {missing[0]} has no {label_column!r} ({labels[missing[0]]!r}; {len(missing)} unlabelled row(s) in all)",
                        f"expected a {'class' if task == 'classification' else 'finite target'} in every row",
                        "fill in or drop those rows")


# ---------------------------------------------------------------------------------- forecasting
class ForecastDataModule(MMTEDataModule):
    """Multi-step forecasting windows over a CSV of numeric columns (ETTh1 and the like).

    The series is split chronologically (``borders``: the start rows of train, val, test and the
    end; default: ETTh's 12/4/4 months when the file is long enough, else 70/10/20 %), standardised
    by the training part's mean and std, and cut into (``input_len``, ``horizon``) windows; validation
    and test windows start ``input_len`` rows before their border (the usual convention).
    Batches: ``{"time_series": [B, input_len, C], "target": [B, horizon, C]}`` (standardised scale).

    Args:
        path: the CSV file.
        input_len: input window length.
        horizon: forecast length.
        columns: the series' columns (None: all but ``time_column``).
        time_column: a timestamp column to drop.
        borders: ``[train_start, val_start, test_start, end]`` rows.
        train_step, eval_step: stride between consecutive windows.
        **kwargs: :class:`MMTEDataModule` options.
    """

    def __init__(
        self,
        path: str,
        input_len: int = 96,
        horizon: int = 24,
        columns: list[str] | None = None,
        time_column: str | None = "date",
        borders: list[int] | None = None,
        train_step: int = 1,
        eval_step: int = 1,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        from ..data.time_series import ETT_HOURLY_BORDERS, load_csv_series

        if not os.path.isfile(path):
            raise FileNotFoundError(f"time-series CSV not found: {path}")
        if input_len < 1 or horizon < 1 or train_step < 1 or eval_step < 1:
            raise ValueError(f"input_len, horizon and steps must be positive; got {input_len}, {horizon}, {train_step}, {eval_step}")
        values, self.columns = load_csv_series(path, columns, time_column)
        n = len(values)
        if borders is None:
            borders = list(ETT_HOURLY_BORDERS) if n >= ETT_HOURLY_BORDERS[-1] else [0, int(0.7 * n), int(0.8 * n), n]
        if len(borders) != 4 or list(borders) != sorted(borders) or borders[-1] > n:
            raise ValueError(f"borders must be 4 increasing row numbers <= {n} (train, val, test starts and end); got {borders}")
        _check_forecast_lengths(path, n, list(borders), input_len, horizon)
        self.path, self.input_len, self.horizon, self.borders = path, input_len, horizon, list(borders)
        self.train_step, self.eval_step = train_step, eval_step
        train = values[borders[0] : borders[1]]
        self.mean, self.std = train.mean(0), np.where(train.std(0) > 0, train.std(0), 1.0)
        self._series = torch.from_numpy(((values - self.mean) / self.std).astype(np.float32))

    @property
    def model_info(self) -> dict[str, Any]:
        return {"tokenizers": {"time_series": {"num_channels": len(self.columns)}}, "horizon": self.horizon, "input_len": self.input_len}

    def build(self) -> None:
        from ..data.time_series import collate_series

        b, L, H = self.borders, self.input_len, self.horizon
        ranges = {"train": (b[0], b[1], self.train_step), "val": (b[1] - L, b[2], self.eval_step), "test": (b[2] - L, b[3], self.eval_step)}
        series = self._series
        self.collates = {"time_series": collate_series}
        for s, (lo, hi, step) in ranges.items():
            starts = list(range(max(lo, 0), hi - L - H + 1, step))
            ds = mds.arrays_dataset(np.asarray(starts), None, "start").add_column("index", starts)

            def window(t, series=series):
                return series[int(t) : int(t) + L]

            def future(t, series=series):
                return series[int(t) + L : int(t) + L + H]

            self.datasets[s] = mds.lazy_preprocess(ds, {"time_series": ("start", window), "target": ("start", future)}, ("index",))
            self.names[s] = [f"t={t}" for t in starts]


def _check_forecast_lengths(path: str, n: int, b: list[int], input_len: int, horizon: int) -> None:
    """Each split must hold at least one (input_len + horizon) window (val/test windows start input_len early)."""
    from ..errors import DataError

    need = input_len + horizon
    for name, rows, have in (("train", b[1] - b[0], b[1] - b[0]), ("val", b[2] - b[1], b[2] - b[1] + input_len),
                             ("test", b[3] - b[2], b[3] - b[2] + input_len)):
        if have < need:
            raise DataError(f"{path} has {n} rows: its {name} part (rows {b[SPLITS.index(name)]}..{b[SPLITS.index(name) + 1]}, {rows} rows) is too short "
                            f"for one window of input_len {input_len} + horizon {horizon}",
                            f"expected at least {need} rows per part (borders {b})",
                            "use a longer file, a smaller --data.init_args.input_len / horizon, or set borders")


# ---------------------------------------------------------------------------------------- pairs
class PairedDataModule(MMTEDataModule):
    """Two single-modality DataModules paired by label, split by split: every item of ``first`` is
    matched with an item of ``second`` that has the same label (a seeded cycle through them).

    E.g. each spoken digit (FSDD, a :class:`FolderDataModule`) with a handwritten digit image of the
    same digit (scikit-learn digits, an :class:`ArrayDataModule`). Batches hold both modalities and
    ``label``.

    Args:
        first: the DataModule whose items are enumerated.
        second: the DataModule items are drawn from; its class names must equal ``first``'s.
        **kwargs: :class:`MMTEDataModule` options (batching, seed).
    """

    def __init__(self, first: MMTEDataModule, second: MMTEDataModule, **kwargs: Any):
        super().__init__(**kwargs)
        for name, dm in (("first", first), ("second", second)):
            if not isinstance(dm, MMTEDataModule) or not hasattr(dm, "modality"):
                raise TypeError(f"{name} must be a single-modality MMTEDataModule (Folder/Array); got {type(dm).__name__}")
        if first.modality == second.modality:
            raise ValueError(f"paired modalities must differ; both are {first.modality!r}")
        if first.class_names != second.class_names:
            raise ValueError(f"cannot pair by label: class names differ ({first.class_names} vs {second.class_names})")
        self.first, self.second, self.class_names = first, second, first.class_names

    def build(self) -> None:
        self.first.setup()
        self.second.setup()
        a_mod, b_mod = self.first.modality, self.second.modality
        self.collates = {**self.first.collates, **self.second.collates}
        for s in SPLITS:
            da, db = self.first.datasets.get(s), self.second.datasets.get(s)
            if da is None or db is None or len(da) == 0 or len(db) == 0:
                continue
            la, lb = _labels(da), _labels(db)
            pairs = mds.pair_by_label(la, lb, self.seed + SPLITS.index(s))
            ds = mds.arrays_dataset(np.asarray([p[0] for p in pairs]), None, "a").add_column("b", [p[1] for p in pairs])
            ds = ds.add_column("label", [la[i] for i, _ in pairs]).add_column("index", list(range(len(pairs))))

            def get_a(i, da=da):
                return da[int(i)][a_mod]

            def get_b(i, db=db):
                return db[int(i)][b_mod]

            self.datasets[s] = mds.lazy_preprocess(ds, {a_mod: ("a", get_a), b_mod: ("b", get_b)}, ("label", "index"))
            na, nb = self.first.names.get(s, []), self.second.names.get(s, [])
            self.names[s] = [f"{na[i] if na else i}|{nb[j] if nb else j}" for i, j in pairs]


def _labels(ds) -> list[int]:
    """A preprocessed dataset's labels without running its transform."""
    raw = ds.with_format(None)
    col = raw["label"]
    return [int(v) for v in (col.tolist() if hasattr(col, "tolist") else col)]
