"""LightningDataModules over :mod:`mmte.data.datasets` (Hugging Face ``datasets``).

Each DataModule builds raw-row datasets (file paths, table rows, arrays) and attaches the modality's
preprocessing from the modality registry lazily (``with_transform``, in the DataLoader workers) or,
with ``cache_dir``, once into an Arrow file reused by later runs. Batches are the model's format:
``{modality: collated value, "label" | "target": tensor, "index": position of each item in its split}``.

**Sources.** Every file-based DataModule takes ``train`` / ``val`` / ``test`` / ``predict`` sources (a
folder, a file or a glob; tables and series: a file, a glob of files, or a split column). A split without
its own source is carved out of the training data (``data_dir`` / ``path``, the *pool*) by patterns,
groups or fractions. So a model trained by a recipe is tested or used on other data with one flag:

::

    mmte test    --config recipes/fsdd_audio.yaml --ckpt_path runs/fsdd_audio/checkpoints/last.ckpt --data.init_args.test /my/wavs
    mmte predict --config recipes/fsdd_audio.yaml --ckpt_path runs/fsdd_audio/checkpoints/last.ckpt --data.init_args.predict /my/wavs

and every file of that source is scored once. An empty split stops with one line naming the option
that would fill it.

**Fitted state.** What is learned from data before training — class maps, the table schema (column
types, scalers, vocabularies), audio feature statistics, a series' scaler — is fitted on the *training
split only* and is the DataModule's :meth:`~MMTEDataModule.state_dict` (plain lists and dicts), which
Lightning saves in every checkpoint under the DataModule's class name. ``state_from`` (set by the
``mmte`` command from ``--ckpt_path``) reads it back, so evaluating or predicting on any other folder or
file uses the training run's preprocessing and class ids and never refits them.

**Shuffling and distributed runs.** Training shuffles with :class:`EpochSeededSampler` (a permutation
of (seed, epoch)), so a resumed run sees the same batches as an uninterrupted one. Under data
parallelism (``trainer.strategy.distributed_sampler_kwargs``) the DataModule shards by itself: rank
``r`` of ``R`` takes every ``R``-th item of the same global permutation, so the union of the ranks' batch
``k`` is one process's batch ``k`` when the per-rank batch size is the global one divided by ``R``;
evaluation splits are sharded the same way without padding, so every item is scored exactly once.
Both samplers subclass ``DistributedSampler``, which Lightning leaves in place; a strategy may also set
``Trainer(use_distributed_sampler=False)`` to make that explicit.

Everything that can be wrong with the inputs (a missing folder or file, a CSV without the named
columns, unreadable files, values that do not fit) is checked when the DataModule is constructed or a
split is built, so the ``mmte`` command fails with one line naming the file, row or option.
:attr:`MMTEDataModule.model_info` tells the model what the data determines (classes, channels,
horizon...); the CLI links it into ``model.data_info``.
"""

from __future__ import annotations

import logging
import math
import os
import re
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
    "ShardedEvalSampler",
    "TableDataModule",
    "checkpoint_for_state",
    "leave_one_group_out",
    "read_data_state",
]

SPLITS = ("train", "val", "test")
STATE_FORMAT = "mmte-data-state/1"


# --------------------------------------------------------------------------------------- samplers
class EpochSeededSampler(DistributedSampler):
    """A random permutation of ``range(n)`` drawn from ``(seed, epoch)`` (Lightning calls ``set_epoch``),
    sharded over data-parallel ranks: rank ``r`` of ``num_replicas`` takes items ``r, r + R, r + 2R, ...``
    of the one global permutation (padded by repeating its start to a multiple of ``R``, or cut with
    ``drop_last``). With a per-rank batch of ``B / R``, the ranks' batch ``k`` together hold exactly one
    process's batch ``k`` of size ``B`` (the global order is the same; only the tail can differ when ``R``
    does not divide ``n``).

    Args:
        n: items in the dataset.
        seed: the permutation's seed (with the epoch).
        num_replicas: data-parallel ranks.
        rank: this rank.
        drop_last: drop the tail so every rank has ``n // R`` items, instead of padding.
    """

    def __init__(self, n: int, seed: int = 0, num_replicas: int = 1, rank: int = 0, drop_last: bool = False):
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, num_replicas); got rank={rank}, num_replicas={num_replicas}")
        super().__init__(range(n), num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=drop_last)
        self.n = n

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.n, generator=g).tolist()
        if self.drop_last:
            order = order[: self.total_size]
        elif len(order) < self.total_size:
            reps = math.ceil((self.total_size - len(order)) / max(len(order), 1))
            order += (order * reps)[: self.total_size - len(order)]
        return iter(order[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples


class ShardedEvalSampler(DistributedSampler):
    """In-order evaluation sampler: rank ``r`` of ``R`` takes items ``r, r + R, ...`` with no padding, so
    every item is evaluated exactly once over all ranks (one rank: ``0 .. n-1``)."""

    def __init__(self, n: int, num_replicas: int = 1, rank: int = 0):
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, num_replicas); got rank={rank}, num_replicas={num_replicas}")
        super().__init__(range(n), num_replicas=num_replicas, rank=rank, shuffle=False)
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.n, self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.num_replicas))


# ---------------------------------------------------------------------------- saved data state
def read_data_state(path: str | os.PathLike, kind: str) -> dict[str, Any] | None:
    """The data state a checkpoint holds for a DataModule class ``kind`` (None: the checkpoint has none).

    Reads a Lightning checkpoint file, or a sharded checkpoint folder's ``meta.pt``, with
    ``torch.load(weights_only=True)`` (nothing is unpickled).

    Raises:
        FileNotFoundError: no such checkpoint.
        ValueError: unreadable, or holding another DataModule class's state.
    """
    p = os.fspath(path)
    if os.path.isdir(p):
        p = os.path.join(p, "meta.pt")
    if not os.path.isfile(p):
        raise FileNotFoundError(f"state_from {os.fspath(path)!r}: no checkpoint there; give the .ckpt the model was trained into")
    try:
        try:
            ck = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # not a zip checkpoint: no mmap
            ck = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (any unreadable file: say so in one line)
        raise ValueError(f"state_from {os.fspath(path)!r} is not a readable checkpoint ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    if not isinstance(ck, Mapping):
        raise TypeError(f"state_from {os.fspath(path)!r} is not a Lightning checkpoint (a {type(ck).__name__}); give a .ckpt written by mmte fit")
    found = {k: v for k, v in ck.items() if isinstance(v, Mapping) and v.get("format") == STATE_FORMAT}
    if kind in found:
        return dict(found[kind])
    if found:
        other = next(iter(found))
        raise ValueError(f"checkpoint {os.fspath(path)!r} holds a {other}'s data state, but this run's data is a {kind}; use the recipe the model was trained with")
    return None


def checkpoint_for_state(ckpt_path: str | None, checkpoint_dir: str | None) -> str | None:
    """The checkpoint file a ``--ckpt_path`` value names (``last``/``best`` -> ``<checkpoint_dir>/<name>.ckpt``
    when it exists), or None."""
    if not ckpt_path:
        return None
    p = os.fspath(ckpt_path)
    if os.path.exists(p):
        return p
    if p in ("last", "best") and checkpoint_dir:
        cand = os.path.join(checkpoint_dir, f"{p}.ckpt")
        return cand if os.path.exists(cand) else None
    return None


# ----------------------------------------------------------------------------------- helpers
def _preprocess_fn(modality: str, options: Mapping[str, Any] | None, min_frames: int | None = None, augment: Any = None) -> Callable[[Any], Any]:
    spec = get_modality(modality)
    if spec.preprocess is None:
        raise ValueError(f"modality {modality!r} has no preprocessing registered; give ready tensors instead")
    fn = partial(augment.fbank if augment is not None else spec.preprocess, **dict(options or {}))
    if modality != "audio" or not min_frames:
        return _as_array_input(fn)

    def audio(path):
        fb = fn(path)
        if fb.shape[0] < min_frames:  # very short clips: repeat the last frame up to one patch
            fb = torch.cat([fb, fb[-1:].expand(min_frames - fb.shape[0], -1)], 0)
        return fb

    return audio


def _group_normed(fn: Callable[[Any], Any], stats: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> Callable[[Any], Any]:
    """``fn(path)`` standardised per mel bin by ``stats[path]`` (``group_norm``)."""

    def call(path):
        mean, std = stats[path]
        return (fn(path) - mean) / std

    return call


def _as_array_input(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def call(value):
        if isinstance(value, list):  # Arrow hands nested lists back
            value = np.asarray(value, dtype=np.float32)
        return fn(value)

    return call


def _cropping_collate(collate: Callable, max_frames: int, mode: str) -> Callable:
    from ..data.audio import crop_frames

    def call(samples):
        return collate([crop_frames(s, max_frames, mode) for s in samples])

    return call


class MMTEDataModule(LightningDataModule):
    """Base class: splits, loaders, collate, fitted state, ``model_info``.

    Args:
        batch_size: training batch size (per data-parallel rank).
        eval_batch_size: validation/test/predict batch size (default: ``batch_size``).
        num_workers: DataLoader worker processes (0: load in the main process).
        seed: seed of the random splits and of the per-epoch shuffling.
        val_fraction: fraction of the training data held out for validation (stratified, seeded) when no val source, pattern or group list decides it.
        test_fraction: fraction of the training data held out for test, likewise (0: no test split unless a test source or pattern gives one).
        predict_split: the split ``mmte predict`` runs on when no ``predict`` source is given (``train``, ``val`` or ``test``).
        cache_dir: preprocess once into Arrow files here and reuse them on later runs (None: lazily, per item).
        drop_last: drop the last incomplete training batch.
        state_from: a checkpoint whose saved data state (class map, table schema, scalers) to use instead of fitting one; the mmte command sets it from --ckpt_path.
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
        state_from: str | None = None,
    ):
        super().__init__()
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int; got {batch_size!r}")
        if eval_batch_size is not None and (not isinstance(eval_batch_size, int) or eval_batch_size < 1):
            raise ValueError(f"eval_batch_size must be a positive int or null; got {eval_batch_size!r}")
        if predict_split not in SPLITS:
            raise ValueError(f"predict_split must be one of {SPLITS}; got {predict_split!r}")
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an int >= 0; got {num_workers!r}")
        for name, f in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not isinstance(f, (int, float)) or not 0.0 <= f < 1.0:
                raise ValueError(f"{name} must be in [0, 1); got {f!r}")
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or batch_size
        self.num_workers, self.seed, self.drop_last = num_workers, seed, drop_last
        self.val_fraction, self.test_fraction, self.predict_split = val_fraction, test_fraction, predict_split
        self.cache_dir, self.state_from = cache_dir, state_from
        self.sources: dict[str, str | None] = {"train": None, "val": None, "test": None, "predict": None}
        self.datasets: dict[str, Any] = {}
        self.names: dict[str, list[str]] = {}
        self.row_info: dict[str, dict[str, list[Any]]] = {}
        self.class_names: list[str] | None = None
        self.collates: dict[str, Callable] = {}
        self.data_state: dict[str, Any] | None = None
        self._why_empty: dict[str, str] = {}

    # ------------------------------------------------------------------------------ fitted state
    def fit_state(self) -> dict[str, Any]:
        """Fit what preprocessing learns from data on the training split (subclasses); plain lists/dicts."""
        return {"class_names": self.class_names}

    def apply_state(self, state: Mapping[str, Any]) -> None:
        """Adopt a fitted state (from :meth:`fit_state` or a checkpoint); subclasses check it fits."""
        self.class_names = list(state["class_names"]) if state.get("class_names") is not None else None

    def _init_state(self) -> None:
        """Fit the state, or read it from ``state_from``; call at the end of a subclass's ``__init__``."""
        state = read_data_state(self.state_from, type(self).__name__) if self.state_from else None
        if self.state_from and state is None:
            logger.warning("checkpoint %s has no saved data state (saved by an older mmte); fitting it on the training split again", self.state_from)
        if state is None:
            state = self.fit_state()
        else:
            state = {k: v for k, v in state.items() if k not in ("format", "kind")}
            logger.info("data state (class map, preprocessing) from %s; nothing is refitted", self.state_from)
        self.apply_state(state)
        self.data_state = dict(state)

    def state_dict(self) -> dict[str, Any]:
        """The fitted data state, saved by Lightning in every checkpoint under this class's name."""
        if self.data_state is None:
            return {}
        return {"format": STATE_FORMAT, "kind": type(self).__name__, **self.data_state}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Adopt a checkpoint's data state (Lightning calls this when restoring); rebuilds the splits if it differs."""
        if not state_dict or state_dict.get("format") != STATE_FORMAT:
            return
        if state_dict.get("kind") != type(self).__name__:
            raise ValueError(f"the checkpoint's data state is a {state_dict.get('kind')}'s; this run's data is a {type(self).__name__}")
        state = {k: v for k, v in state_dict.items() if k not in ("format", "kind")}
        if state == self.data_state:
            return
        self.apply_state(state)
        self.data_state = state
        self.datasets.clear()
        logger.info("data state restored from the checkpoint; splits are rebuilt with it")

    # ----------------------------------------------------------------------------------- splits
    @property
    def model_info(self) -> dict[str, Any]:
        """What the model must agree with: ``num_classes`` etc. (linked to ``model.data_info``)."""
        return {"num_classes": len(self.class_names)} if self.class_names else {}

    @property
    def prediction_split(self) -> str:
        """The split ``mmte predict`` runs on: ``predict`` when that source is set, else ``predict_split``."""
        return "predict" if self.sources.get("predict") is not None else self.predict_split

    def build_split(self, split: str) -> None:
        """Fill ``self.datasets[split]``, ``self.names[split]`` (and ``self.row_info[split]``); subclasses."""
        raise NotImplementedError

    def build(self) -> None:
        """Build the train, val and test splits (and ``predict`` when it has a source)."""
        for s in (*SPLITS, "predict"):
            self._ensure(s)

    def _ensure(self, split: str) -> Any:
        if split == "predict" and self.sources.get("predict") is None:
            split = self.predict_split
        if split not in self.datasets:
            self.build_split(split)
        return self.datasets[split]

    def setup(self, stage: str | None = None) -> None:
        wanted = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": (self.prediction_split,)}.get(stage or "", None)
        for s in wanted or (*SPLITS, *(("predict",) if self.sources.get("predict") is not None else ())):
            self._ensure(s)

    def empty_message(self, split: str) -> str:
        """One line: why ``split`` is empty and which option fills it."""
        if split == "predict":
            if self.sources.get("predict") is None:
                why = self._why_empty.get(self.predict_split, "it has no items")
                return (f"the {self.predict_split!r} split that predict_split names is empty ({why}); pass --data.init_args.predict "
                        f"<{self._source_kinds}> to predict on other data, or set predict_split")
            return f"the 'predict' split is empty ({self._why_empty.get('predict', 'its source has no items')}); point --data.init_args.predict at your data"
        why = self._why_empty.get(split, "it has no items")
        if split == "train":
            return f"the 'train' split is empty ({why}); point --data.init_args.train (or the recipe's data option) at your training data"
        return f"the {split!r} split is empty ({why}); pass --data.init_args.{split} <{self._source_kinds}>{self._carve_hint(split)}"

    _source_kinds = "folder|file|glob"

    def _carve_hint(self, split: str) -> str:
        return f", or set {split}_fraction to hold part of the training data out"

    def _replicas(self) -> tuple[int, int]:
        """``(data-parallel ranks, this rank)`` from ``trainer.strategy.distributed_sampler_kwargs`` (1, 0 without one)."""
        strategy = getattr(getattr(self, "trainer", None), "strategy", None)
        try:  # tensor- and pipeline-parallel ranks of one data-parallel replica read the same data
            kw = getattr(strategy, "distributed_sampler_kwargs", None) if getattr(strategy, "world_size", 1) > 1 else None
        except (AssertionError, AttributeError, RuntimeError):  # a parallel strategy not set up yet (no mesh)
            kw = None
        if not kw:
            return 1, 0
        return int(kw.get("num_replicas", 1) or 1), int(kw.get("rank", 0) or 0)

    def collates_for(self, split: str) -> dict[str, Callable]:
        """The per-modality collate functions of ``split`` (``train`` may crop randomly; any other name: evaluation)."""
        return self.collates

    def _collate(self, samples: list[Mapping[str, Any]], split: str = "val") -> dict[str, Any]:
        """Collate items of ``split`` into a batch (what the loaders do; evaluation cropping by default)."""
        return collate_batch(samples, self.collates_for(split))

    def _loader(self, split: str, train: bool) -> DataLoader:
        ds = self._ensure(split)
        if ds is None or len(ds) == 0:
            raise ValueError(self.empty_message(split))
        replicas, rank = self._replicas()
        kw: dict[str, Any] = {
            "collate_fn": partial(collate_batch, collates=self.collates_for("train" if train else "eval")),  # eval: no random crops
            "num_workers": self.num_workers,
            "persistent_workers": self.num_workers > 0,
        }
        if train:
            sampler = EpochSeededSampler(len(ds), self.seed, replicas, rank)
            # resumable: a run stopped mid-epoch (SIGTERM) continues with the batches it had not seen yet
            return ResumableDataLoader(ds, batch_size=self.batch_size, sampler=sampler, drop_last=self.drop_last, **kw)
        return DataLoader(ds, batch_size=self.eval_batch_size, sampler=ShardedEvalSampler(len(ds), replicas, rank), **kw)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader("predict", False)

    def row_names(self, split: str) -> list[str]:
        """Human-readable ids of a split's items (file names, row ids, window start times), in order."""
        ds = self._ensure(split)
        split = self.prediction_split if split == "predict" else split
        return self.names.get(split) or [str(i) for i in range(len(ds))]

    def row_columns(self, split: str) -> dict[str, list[Any]]:
        """Columns identifying a split's items, for prediction files: ``id`` and e.g. ``path`` or window times."""
        names = self.row_names(split)
        split = self.prediction_split if split == "predict" else split
        return {"id": names, **self.row_info.get(split, {})}

    def _prepare(self, ds, fns: Mapping[str, tuple[str, Callable]], key: Any, keep: Sequence[str] = ("label", "index")):
        if self.cache_dir and len(ds) > 0:
            return mds.cached_preprocess(ds, fns, self.cache_dir, key, keep)
        return mds.lazy_preprocess(ds, fns, keep)

    def _split_by_fraction(self, labels: Sequence[Any]) -> dict[str, list[int]]:
        return mds.split_indices(labels, self.val_fraction, self.test_fraction, self.seed)


# --------------------------------------------------------------------------------------- arrays
class ArrayDataModule(MMTEDataModule):
    """In-memory arrays: one of scikit-learn's bundled datasets (``"digits"``: 1,797 8x8 images).

    Args:
        dataset: ``digits`` (images [8, 8] in [0, 1]), or ``iris``/``wine``/``breast_cancer`` (feature vectors; use those with TableDataModule and sklearn://).
        modality: the batch key and the registry modality whose preprocessing is applied.
        preprocess: keyword arguments of that preprocessing (e.g. image ``size``, ``mean``, ``std``, ``channels``).
        **kwargs: :class:`MMTEDataModule` options.
    """

    def __init__(self, dataset: str = "digits", modality: str = "image", preprocess: dict[str, Any] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        if dataset not in mds.SKLEARN_DATASETS:
            raise ValueError(f"unknown dataset {dataset!r}; expected one of {mds.SKLEARN_DATASETS}")
        self.dataset, self.modality, self.preprocess = dataset, modality, dict(preprocess or {})
        self._fn = _preprocess_fn(modality, self.preprocess)  # validates the modality name now
        self._x, self._y, names = mds.sklearn_arrays(dataset)
        self._dataset_classes = names
        self.class_names = names
        self._split: dict[str, list[int]] | None = None
        self.indices: dict[str, list[int]] = {}  # split -> rows of the scikit-learn dataset
        self._init_state()

    def apply_state(self, state: Mapping[str, Any]) -> None:
        if list(state["class_names"]) != self._dataset_classes:
            raise ValueError(f"the checkpoint's classes {state['class_names']} are not those of {self.dataset!r} ({self._dataset_classes})")
        super().apply_state(state)

    def build_split(self, split: str) -> None:
        if split not in SPLITS:
            raise ValueError(f"ArrayDataModule has no {split!r} split; it has {SPLITS}")
        if self._split is None:
            self._split = self._split_by_fraction(self._y)
        idx = self._split[split]
        fns = {self.modality: ("x", self._fn)}
        self.collates = {self.modality: get_modality(self.modality).collate_fn}
        ds = mds.arrays_dataset(self._x[idx], self._y[idx]).add_column("index", list(range(len(idx))))
        self.datasets[split] = self._prepare(ds, fns, (self.dataset, self.modality, self.preprocess, split, self.seed, "pos"))
        self.names[split] = [f"{self.dataset}[{i}]" for i in idx]
        self.indices[split] = [int(i) for i in idx]
        if split != "train":
            self._why_empty[split] = f"{split}_fraction is {getattr(self, f'{split}_fraction', 0.0)}"


# -------------------------------------------------------------------------------------- folders
class FolderDataModule(MMTEDataModule):
    """Files (audio, images, ...) from folders, files or globs, with labels from the file names or a CSV.

    The training data is ``train`` (or ``data_dir``). A split with its own source (``val``, ``test``,
    ``predict``: a folder, a file or a glob) uses all of it; otherwise it is carved out of the training
    data, in this order: a file-name pattern (``val_regex`` / ``test_regex``), named groups
    (``val_groups`` / ``test_groups``, with ``group_regex``), then a fraction (of the groups when
    ``group_regex`` is set, so no speaker is in two splits; else of the files, stratified by label).
    Class ids come from the training split's labels and are saved with the model; evaluating on a subset
    of the classes works, and a label the training split never had is an error naming the file.

    For leave-one-group-out evaluation see :func:`leave_one_group_out`.

    Args:
        data_dir: the folder of the training data (searched recursively); same as train, kept for recipes.
        modality: registry modality of the files (``audio``, ``image``, ``point_cloud``, ...).
        pattern: file-name glob the files must match (e.g. ``"*.wav"``), in folders and globs alike.
        label_regex: regular expression whose first group, searched in a file's relative name, is its label (``"^(\\d+)_"`` for FSDD).
        labels_csv: instead of label_regex, a CSV with a file_column (relative path or base name) and a label_column.
        file_column: the labels_csv column holding file names.
        label_column: the labels_csv column holding labels.
        train: training files: a folder, a file or a glob (default: data_dir); val/test without their own source are carved out of them.
        val: validation files (folder, file or glob); all of them are used and val_regex/val_groups/val_fraction are ignored.
        test: test files (folder, file or glob) for mmte test; all of them are scored once.
        predict: files to predict on (folder, file or glob) for mmte predict, labels optional; default: the predict_split split.
        val_regex: training-data files whose relative name matches go to validation (e.g. ``"_[0-4]\\.wav$"``, FSDD's own test split).
        test_regex: training-data files whose relative name matches go to test.
        group_regex: regular expression whose first group is a file's group, e.g. its speaker (FSDD: ``'^\\d+_([a-z]+)_'``); held-out splits then take whole groups.
        val_groups: groups (names) held out for validation; with group_regex.
        test_groups: groups (names) held out for test, e.g. one speaker; with group_regex.
        on_corrupt: ``"error"`` (stop with the file's name before training) or ``"skip"`` (drop unreadable files with one warning giving their count).
        preprocess: keyword arguments of the modality's preprocessing (audio: ``target_rate``, ``num_mel_bins``, ``mean``, ``std``...).
        normalize: audio only: ``fixed`` (preprocess mean/std, AudioSet's by default) or ``train`` (mean/std of the training split's fbanks, fitted once and saved with the model).
        min_frames: audio only: pad fbanks shorter than this (one patch) by repeating the last frame.
        max_frames: audio only: longest clip in frames (10 ms each); longer clips are cropped as crop says, and how many is logged once per split (None: no limit).
        crop: audio only: which max_frames frames of a long clip are kept: ``start``, ``center``, or ``random`` (a random window in training, the centre one in evaluation).
        augment: audio only: training-split augmentation (mmte.data.augment), e.g. ``{speed: [0.9, 1.1], shift: 0.1, gain_db: 6, noise_snr_db: [10, 40], freq_masks: 2, freq_width: 8, time_masks: 2, time_width: 10, vtlp: [0.9, 1.1], tempo: [0.8, 1.25]}``; None: off.
        group_norm: audio only, with group_regex: standardise every clip per mel bin by the mean and std of all the
            clips of its group (the speaker) in the same split, measured on the unaugmented fbanks (per-speaker
            CMVN, as speaker-independent speech recognisers do): the speaker's microphone and voice colouring
            go, the words stay. Evaluation splits use their own clips' statistics (no labels), so a new
            speaker is normalised by its own recordings; a file whose name group_regex does not match is its
            own group (per-utterance CMVN).
        **kwargs: :class:`MMTEDataModule` options.
    """

    def __init__(
        self,
        data_dir: str | None = None,
        modality: str = "audio",
        pattern: str = "*",
        label_regex: str | None = None,
        labels_csv: str | None = None,
        file_column: str = "file",
        label_column: str = "label",
        train: str | None = None,
        val: str | None = None,
        test: str | None = None,
        predict: str | None = None,
        val_regex: str | None = None,
        test_regex: str | None = None,
        group_regex: str | None = None,
        val_groups: list[str] | None = None,
        test_groups: list[str] | None = None,
        on_corrupt: str = "error",
        preprocess: dict[str, Any] | None = None,
        normalize: str = "fixed",
        min_frames: int | None = 16,
        max_frames: int | None = None,
        crop: str = "start",
        augment: dict[str, Any] | None = None,
        group_norm: bool = False,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        from ..data.audio import CROPS
        from ..data.augment import AudioAugment

        if augment and modality != "audio":
            raise ValueError(f"augment is for audio; modality is {modality!r}")
        self.augment, self._augment = augment, AudioAugment.from_config(augment)

        if (label_regex is None) == (labels_csv is None):
            raise ValueError(f"give exactly one of label_regex or labels_csv; got label_regex={label_regex!r}, labels_csv={labels_csv!r}")
        if on_corrupt not in ("error", "skip"):
            raise ValueError(f"on_corrupt must be 'error' or 'skip'; got {on_corrupt!r}")
        if crop not in CROPS:
            raise ValueError(f"crop must be one of {CROPS}; got {crop!r}")
        if normalize not in ("fixed", "train"):
            raise ValueError(f"normalize must be 'fixed' or 'train'; got {normalize!r}")
        if normalize == "train" and (preprocess or {}).get("frontend") == "speech_embedding":
            raise ValueError("normalize 'train' fits a mean/std to the fbanks, but preprocess frontend speech_embedding has its "
                             "own fixed scale (the pretrained network's input): use normalize 'fixed'")
        if normalize == "train" and modality != "audio":
            raise ValueError(f"normalize: train is for audio; modality is {modality!r}")
        if max_frames is not None and (not isinstance(max_frames, int) or max_frames < 1):
            raise ValueError(f"max_frames must be a positive int or null; got {max_frames!r}")
        for name, rx in (("label_regex", label_regex), ("val_regex", val_regex), ("test_regex", test_regex), ("group_regex", group_regex)):
            if rx is not None:
                try:
                    compiled = re.compile(rx)
                except re.error as e:
                    raise ValueError(f"{name} {rx!r} is not a regular expression ({e})") from None
                if name in ("label_regex", "group_regex") and compiled.groups < 1:
                    raise ValueError(f"{name} {rx!r} needs a group (...) capturing the {'label' if name == 'label_regex' else 'group'}")
        if group_norm not in (True, False):
            raise ValueError(f"group_norm must be true or false; got {group_norm!r}")
        if group_norm and (modality != "audio" or group_regex is None):
            raise ValueError(f"group_norm is for audio with a group_regex (the speaker); got modality {modality!r}, group_regex {group_regex!r}")
        self.group_norm = group_norm
        for name, groups in (("val_groups", val_groups), ("test_groups", test_groups)):
            if groups is not None and group_regex is None:
                raise ValueError(f"{name} needs group_regex (a pattern whose first group is a file's group, e.g. '^\\d+_([a-z]+)_')")
        if train is not None and data_dir is not None and os.fspath(train) != os.fspath(data_dir):
            logger.info("train %s replaces data_dir %s as the training data", train, data_dir)
        self.modality, self.preprocess, self.pattern = modality, dict(preprocess or {}), pattern
        self.data_dir, self.label_regex, self.labels_csv = data_dir, label_regex, labels_csv
        self.file_column, self.label_column, self.on_corrupt = file_column, label_column, on_corrupt
        self.val_regex, self.test_regex, self.group_regex = val_regex, test_regex, group_regex
        self.val_groups = None if val_groups is None else [str(g) for g in val_groups]
        self.test_groups = None if test_groups is None else [str(g) for g in test_groups]
        self.normalize, self.min_frames, self.max_frames, self.crop = normalize, min_frames, max_frames, crop
        self.sources = {"train": train if train is not None else data_dir, "val": val, "test": test, "predict": predict}
        self.skipped = 0
        self._scans: dict[tuple[str, str], dict[str, list[Any]]] = {}
        self._assign: dict[str, list[int]] | None = None
        get_modality(modality)  # an unknown modality fails now
        if self.state_from is None:
            if self.sources["train"] is None:
                raise ValueError("FolderDataModule needs training data: set data_dir or train (a folder, file or glob)")
            self._pool()  # scan and check the training folder now, so bad input fails before anything runs
        for s in ("val", "test", "predict"):
            if self.sources[s] is not None and self.state_from is None:
                self._scan(s)
        self._init_state()

    # ------------------------------------------------------------------------------- scanning
    @property
    def _pool_option(self) -> str:
        return "train" if self.data_dir is None or (self.sources["train"] != self.data_dir) else "data_dir"

    def _scan(self, split: str) -> dict[str, list[Any]]:
        """Files, names, labels (None where unknown) and groups of a split's own source ('train': the pool)."""
        src = self.sources[split]
        option = self._pool_option if split == "train" else split
        if src is None:
            raise ValueError(self.empty_message(split))
        key = (os.fspath(src), option)
        if key in self._scans:
            return self._scans[key]
        paths, names = mds.list_files(src, self.pattern, option)
        good = mds.check_files(paths, self.modality, self.on_corrupt)
        if len(good) < len(paths):
            self.skipped += len(paths) - len(good)
            paths, names = [paths[i] for i in good], [names[i] for i in good]
        labels = mds.file_labels(names, label_regex=self.label_regex, labels_csv=self.labels_csv, file_column=self.file_column,
                                 label_column=self.label_column, required=split != "predict", option=option)
        groups: list[str | None] = [None] * len(names)
        if self.group_regex is not None and split == "train":
            rx = re.compile(self.group_regex)
            groups = []
            for n in names:
                m = rx.search(n)
                if m is None:
                    raise ValueError(f"file {n!r} of {option} does not match group_regex {self.group_regex!r} (expected a group capturing e.g. the speaker)")
                groups.append(m.group(1))
        scan = {"path": paths, "name": names, "label": labels, "group": groups}
        self._scans[key] = scan
        return scan

    def _pool(self) -> dict[str, list[Any]]:
        return self._scan("train")

    def groups(self) -> list[str]:
        """The training data's groups (``group_regex``), sorted."""
        if self.group_regex is None:
            raise ValueError("groups() needs group_regex (a pattern whose first group is a file's group)")
        return sorted(set(self._pool()["group"]))

    def _assignment(self) -> dict[str, list[int]]:
        """Pool file indices of train and of the val/test splits that have no source of their own."""
        if self._assign is not None:
            return self._assign
        pool = self._pool()
        names, labels, groups = pool["name"], pool["label"], pool["group"]
        where = f"{self._pool_option} {os.fspath(self.sources['train'])!r}"
        left = list(range(len(names)))
        out: dict[str, list[int]] = {"train": [], "val": [], "test": []}
        fraction: dict[str, float] = {}
        if self.group_regex is not None:
            known = set(groups)
            for name, gl in (("val_groups", self.val_groups), ("test_groups", self.test_groups)):
                unknown = sorted(set(gl or []) - known)
                if unknown:
                    raise ValueError(f"{name} {unknown} are not groups of the training data; group_regex finds {sorted(known)}")
        for s in ("test", "val"):
            if self.sources[s] is not None:
                continue
            rx = getattr(self, f"{s}_regex")
            chosen = getattr(self, f"{s}_groups")
            if rx is not None:
                r = re.compile(rx)
                take = [i for i in left if r.search(names[i])]
                self._why_empty[s] = f"{s}_regex {rx!r} matches no file of {where}"
            elif chosen is not None:
                take = [i for i in left if groups[i] in set(chosen)]
                self._why_empty[s] = f"{s}_groups {chosen} hold no file of {where}"
            else:
                f = getattr(self, f"{s}_fraction")
                fraction[s] = f
                self._why_empty[s] = f"no {s} source, {s}_regex or {s}_groups is set and {s}_fraction is {f}"
                continue
            out[s] = take
            taken = set(take)
            left = [i for i in left if i not in taken]
        if any(fraction.values()):
            vf, tf = fraction.get("val", 0.0), fraction.get("test", 0.0)
            if self.group_regex is not None:
                parts = mds.group_split([groups[i] for i in left], vf, tf, self.seed)
                for s in ("val", "test"):
                    if s in fraction:
                        out[s] = [i for i in left if groups[i] in set(parts[s])]
                        logger.info("%s split: group(s) %s held out (%d files)", s, parts[s], len(out[s]))
            else:
                sp = mds.split_indices([labels[i] for i in left], vf, tf, self.seed)
                for s in ("val", "test"):
                    if s in fraction:
                        out[s] = [left[j] for j in sp[s]]
            held = {i for s in ("val", "test") for i in out[s]}
            left = [i for i in left if i not in held]
        out["train"] = left
        self._why_empty["train"] = f"every file of {where} went to the held-out splits"
        self._assign = out
        return out

    def _carve_hint(self, split: str) -> str:
        return f", or set {split}_regex / {split}_groups / {split}_fraction to carve it out of the training data"

    # ---------------------------------------------------------------------------------- state
    def fit_state(self) -> dict[str, Any]:
        pool = self._pool()
        train_labels = [pool["label"][i] for i in self._assignment()["train"]]
        if not train_labels:
            raise ValueError(self.empty_message("train"))
        state: dict[str, Any] = {"modality": self.modality, "class_names": mds.sort_labels(train_labels), "fbank_stats": None}
        if self.normalize == "train":
            state["fbank_stats"] = self._fbank_stats([pool["path"][i] for i in self._assignment()["train"]])
        return state

    def _fbank_stats(self, paths: Sequence[str]) -> list[float]:
        opts = {**self.preprocess, "mean": None, "std": None}
        fn = _preprocess_fn("audio", opts)
        total, total_sq, count = 0.0, 0.0, 0
        for p in paths:
            fb = fn(p).double()
            total += float(fb.sum())
            total_sq += float((fb * fb).sum())
            count += fb.numel()
        mean = total / count
        std = math.sqrt(max(total_sq / count - mean * mean, 1e-12))
        logger.info("audio fbank statistics from the %d training clips: mean %.4f, std %.4f (saved with the model)", len(paths), mean, std)
        return [mean, std]

    def apply_state(self, state: Mapping[str, Any]) -> None:
        if state.get("modality", self.modality) != self.modality:
            raise ValueError(f"the checkpoint's data is modality {state.get('modality')!r}; this run's is {self.modality!r}")
        super().apply_state(state)
        self.fbank_stats = state.get("fbank_stats")
        opts = dict(self.preprocess)
        if self.fbank_stats is not None:
            opts["mean"], opts["std"] = self.fbank_stats
        self._effective_preprocess = opts
        self._fn = _preprocess_fn(self.modality, opts, self.min_frames)
        self.datasets.clear()

    @property
    def model_info(self) -> dict[str, Any]:
        info = dict(super().model_info)
        if self.modality == "audio":  # the audio tokenizer's stem must read this spectrogram
            info["audio_frontend"] = self.preprocess.get("frontend", "kaldi")
        return info

    # ---------------------------------------------------------------------------------- build
    def collates_for(self, split: str) -> dict[str, Callable]:
        base = get_modality(self.modality).collate_fn
        if self.modality != "audio" or self.max_frames is None:
            return {self.modality: base}
        mode = self.crop if split == "train" or self.crop != "random" else "center"
        return {self.modality: _cropping_collate(base, self.max_frames, mode)}

    def _rows(self, split: str) -> tuple[list[str], list[str], list[str | None]]:
        if split == "predict" or self.sources[split] is not None and split != "train":
            scan = self._scan(split)
            return scan["path"], scan["name"], scan["label"]
        pool, idx = self._pool(), self._assignment()[split]
        return [pool["path"][i] for i in idx], [pool["name"][i] for i in idx], [pool["label"][i] for i in idx]

    def build_split(self, split: str) -> None:
        if split in ("val", "test") and self.sources[split] is None and getattr(self, f"{split}_regex") is None \
                and getattr(self, f"{split}_groups") is None and not getattr(self, f"{split}_fraction"):
            self._why_empty[split] = f"no {split} source, {split}_regex or {split}_groups is set and {split}_fraction is {getattr(self, f'{split}_fraction')}"
            paths, names, labels = [], [], []
        else:
            paths, names, labels = self._rows(split)
        index = {c: i for i, c in enumerate(self.class_names or [])}
        ids: list[int] = []
        unknown = []
        for n, lab in zip(names, labels):
            k = index.get(lab) if lab is not None else None
            if k is None and split != "predict":
                raise ValueError(
                    f"file {n!r} of the {split} split has label {lab!r}, which the training split does not have "
                    f"(classes {self.class_names}); remove it, or train with that class"
                )
            if k is None and lab is not None:
                unknown.append(n)
            ids.append(-1 if k is None else k)
        if unknown:
            logger.warning("predict: %d file(s) have labels the model was not trained on (first: %s); their target is left empty", len(unknown), unknown[0])
        cols: dict[str, list[Any]] = {"path": list(paths), "name": list(names)}
        keep: tuple[str, ...] = ("index",)
        if split != "predict" or any(lab is not None for lab in labels):  # predict: targets only where files have labels
            cols["label"], keep = ids, ("label", "index")
        import datasets

        ds = datasets.Dataset.from_dict({**cols, "index": list(range(len(paths)))}) if paths else datasets.Dataset.from_dict({"path": [], "name": [], "index": []})
        self.collates = {self.modality: get_modality(self.modality).collate_fn}
        plain, key = self._fn, (self.modality, self._effective_preprocess, self.min_frames)
        norm = self._group_stats(split, paths, names) if self.group_norm and len(ds) else None
        if norm is not None:
            plain, key = _group_normed(plain, norm), (*key, "group_norm")
        if len(ds) and split == "train" and self._augment is not None:  # a fresh draw per item and epoch: never cached
            fn = _preprocess_fn(self.modality, self._effective_preprocess, self.min_frames, self._augment)
            ds = mds.lazy_preprocess(ds, {self.modality: ("path", fn if norm is None else _group_normed(fn, norm))}, keep)
        elif len(ds):
            ds = self._prepare(ds, {self.modality: ("path", plain)}, key, keep)
        self.datasets[split] = ds
        self.names[split] = list(names)
        self.row_info[split] = {"path": [os.path.abspath(p) for p in paths]}
        if split == "predict":
            self._why_empty["predict"] = f"{self.sources['predict']!r} has no file"
        self._report_crops(split, paths)

    def _group_stats(self, split: str, paths: Sequence[str], names: Sequence[str]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``group_norm``: path -> (mean [F], std [F]) of the unaugmented fbanks of all the split's clips in its group."""
        rx = re.compile(self.group_regex)
        groups: dict[str, list[str]] = {}
        for p, n in zip(paths, names):
            m = rx.search(n)
            groups.setdefault(m.group(1) if m else f"file:{n}", []).append(p)
        out = {}
        for ps in groups.values():
            fbs = torch.cat([self._fn(p).double() for p in ps], 0)
            mean, std = fbs.mean(0), fbs.std(0, unbiased=False).clamp_min(1e-5)
            out.update({p: (mean.float(), std.float()) for p in ps})
        alone = sum(g.startswith("file:") for g in groups)
        logger.info("%s split: each clip standardised per mel bin by its group's statistics (group_norm): %d group(s)%s", split,
                    len(groups) - alone, f", {alone} file(s) group_regex does not match, each by its own" if alone else "")
        return out

    def _report_crops(self, split: str, paths: Sequence[str]) -> None:
        if self.modality != "audio" or self.max_frames is None or not paths:
            return
        import soundfile as sf

        from ..data.audio import fbank_frames

        rate = int(self.preprocess.get("target_rate", 16000))
        fl, fs = float(self.preprocess.get("frame_length", 25.0)), float(self.preprocess.get("frame_shift", 10.0))
        if self.preprocess.get("frontend") == "speech_embedding":
            fl = 32.0  # a 512-point FFT window
        frames = []
        for p in paths:
            info = sf.info(p)
            frames.append(fbank_frames(info.frames, info.samplerate, rate, fl, fs))
        n_long = sum(f > self.max_frames for f in frames)
        if n_long:
            mode = self.crop if split == "train" or self.crop != "random" else "center"
            how = "randomly cropped (a new window each time)" if mode == "random" else f"cropped to their {'first' if mode == 'start' else 'middle'} {self.max_frames} frames"
            logger.info("%s split: %d of %d clips are longer than max_frames=%d (%.2f s; longest %d frames%s) and are %s",
                        split, n_long, len(frames), self.max_frames, self.max_frames * fs / 1000, max(frames),
                        ", counted before silence trimming" if self.preprocess.get("trim_db") else "", how)

    def split_dataset(self, split: str):
        """The preprocessed dataset of one split (used by :class:`PairedDataModule`)."""
        return self._ensure(split)


def leave_one_group_out(**folder_kwargs: Any) -> Iterator[tuple[str, FolderDataModule]]:
    """Leave-one-group-out folds over a folder: one :class:`FolderDataModule` per group (``group_regex``'s
    first group, e.g. the speaker), with that group as the test split and the others for training (and
    validation, by ``val_groups`` / ``val_fraction`` of the remaining groups).

    Example:
        ``for speaker, dm in leave_one_group_out(data_dir=..., pattern="*.wav", label_regex=r"^(\\d+)_",
        group_regex=r"^\\d+_([a-z]+)_", val_fraction=0.0): ...``

    Yields:
        ``(held-out group, DataModule)`` in sorted group order.
    """
    if not folder_kwargs.get("group_regex"):
        raise ValueError("leave_one_group_out needs group_regex (a pattern whose first group is a file's group)")
    base = FolderDataModule(**{**folder_kwargs, "val_fraction": 0.0, "test_fraction": 0.0, "val_regex": None, "test_regex": None,
                               "val_groups": None, "test_groups": None})
    for g in base.groups():
        yield g, FolderDataModule(**{**folder_kwargs, "test_groups": [g]})


# --------------------------------------------------------------------------------------- tables
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
        from ..data.tabular import DEFAULT_MISSING, TableSchema

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
        from ..data.tabular import read_frame

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
        from ..data.tabular import _cell, _missing, _numbers, category_key, describe_row

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
            from ..data.tabular import describe_row

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
            sp = mds.split_indices(strat, vf, tf, self.seed)
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
        from ..data.tabular import TableSchema

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
        from ..data.tabular import TableSchema

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
        from ..data.tabular import FILE_COL, ROW_COL, collate_tabular, describe_row

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


# ---------------------------------------------------------------------------------- forecasting
class ForecastDataModule(MMTEDataModule):
    """Multi-step forecasting windows over CSVs of numeric columns (ETTh1 and the like).

    The training series (``train`` or ``path``) is split chronologically by the dataset's own convention
    when it is known (ETT files: 12/4/4 months, hourly or 15-minute rows read from the timestamps), else
    by ``fractions`` (:func:`mmte.data.time_series.split_borders`), or by explicit ``borders``. It is
    standardised by the training rows' mean and std (saved with the model and reused for every other
    file) and cut into (``input_len``, ``horizon``) windows; validation and test windows start
    ``input_len`` rows before their border (the usual convention), one every ``eval_step`` rows (1: every
    window, as in the literature). A ``val``/``test`` file is windowed whole; a ``predict`` file also gets
    its final window, whose future lies beyond the file (target NaN there).
    Batches: ``{"time_series": [B, input_len, C], "target": [B, horizon, C]}`` (standardised scale).

    Args:
        path: the training series CSV (same as train).
        input_len: input window length (rows).
        horizon: forecast length (rows).
        columns: the series' columns (None: all but time_column).
        time_column: the timestamp column (its spacing tells hourly from 15-minute ETT files; window start times in predictions); null: none.
        train: the training series CSV (default: path); val/test without their own file are cut from it.
        val: a validation CSV, windowed whole with the training scaler.
        test: a test CSV for mmte test, windowed whole (every eval_step-th window) with the training scaler.
        predict: a CSV to forecast from for mmte predict: every eval_step-th window and the final one (beyond the file's end).
        split: ``auto`` (ETT's 12/4/4-month convention for ETT files, else fractions), ``ett``, or ``fractions``.
        fractions: [train, val, test] fractions of the rows for split: fractions (literature: 0.7, 0.1, 0.2; [1, 0, 0]: train on every row).
        borders: explicit [train_start, val_start, test_start, end] rows, overriding split.
        train_step: stride between training windows.
        eval_step: stride between validation/test/predict windows (1: every window, the literature protocol).
        cycle: a fixed seasonal cycle the model takes out of its inputs and adds back to its forecasts: a
            duration (``1D``, ``24h``, ``7D``; pandas offsets) or a number of rows. Its level, each
            channel's mean standardised value at each phase of the cycle over the training rows, is saved
            with the model. Each window carries the level at its input and forecast steps (placed by the
            timestamps, so every file needs ``time_column``); the model forecasts what the cycle does not
            explain, and targets, metrics and predictions stay on the plain standardised scale. None: no cycle.
        **kwargs: :class:`MMTEDataModule` options.
    """

    _source_kinds = "file"

    def __init__(
        self,
        path: str | None = None,
        input_len: int = 96,
        horizon: int = 24,
        columns: list[str] | None = None,
        time_column: str | None = "date",
        train: str | None = None,
        val: str | None = None,
        test: str | None = None,
        predict: str | None = None,
        split: str = "auto",
        fractions: list[float] | None = None,
        borders: list[int] | None = None,
        train_step: int = 1,
        eval_step: int = 1,
        cycle: int | str | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        for name, v in (("input_len", input_len), ("horizon", horizon), ("train_step", train_step), ("eval_step", eval_step)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int; got {v!r}")
        if split not in ("auto", "ett", "fractions"):
            raise ValueError(f"split must be 'auto', 'ett' or 'fractions'; got {split!r}")
        self.path, self.input_len, self.horizon, self.columns_opt = path, input_len, horizon, columns
        self.time_column, self.split, self.fractions = time_column, split, list(fractions or (0.7, 0.1, 0.2))
        self.borders_opt, self.train_step, self.eval_step = borders, train_step, eval_step
        if cycle is not None and (isinstance(cycle, bool) or not isinstance(cycle, (int, str)) or (isinstance(cycle, int) and cycle < 2)):
            raise ValueError(f"cycle must be a duration such as '1D' or '24h', a number of rows >= 2, or null; got {cycle!r}")
        self.cycle_opt = cycle
        self.sources = {"train": train if train is not None else path, "val": val, "test": test, "predict": predict}
        self._series: dict[str, tuple[np.ndarray, list[str], np.ndarray | None]] = {}
        self.borders: list[int] | None = None
        if self.state_from is None:
            if self.sources["train"] is None:
                raise ValueError("ForecastDataModule needs a training series: set path or train (a CSV file)")
            self._borders()
        for s in ("val", "test", "predict"):
            if self.sources[s] is not None and self.state_from is None:
                self._read(s)
        self._init_state()

    def _read(self, split: str) -> tuple[np.ndarray, list[str], np.ndarray | None]:
        from ..data.time_series import read_series

        src = self.sources[split]
        if src is None:
            raise ValueError(self.empty_message(split))
        if src not in self._series:
            option = "path" if split == "train" and self.path is not None else split
            cols = self.columns_opt if split == "train" or self.data_state is None else self.data_state["columns"]
            self._series[src] = read_series(src, cols, self.time_column, option)
        return self._series[src]

    def _borders(self) -> list[int]:
        from ..data.time_series import split_borders

        if self.borders is not None:
            return self.borders
        values, cols, stamps = self._read("train")
        n = len(values)
        where = f"{os.fspath(self.sources['train'])!r}"
        if self.borders_opt is not None:
            b = list(self.borders_opt)
            if len(b) != 4 or b != sorted(b) or b[-1] > n or b[0] < 0:
                raise ValueError(f"borders must be 4 increasing row numbers <= {n} (train, val, test starts and end); got {b}")
            desc = f"borders {b}"
        else:
            b, desc = split_borders(n, cols, stamps, self.split, self.fractions, where)
        logger.info("%s: %s", where, desc)
        if b[1] - b[0] < self.input_len + self.horizon:
            raise ValueError(
                f"the training part of {where} (rows {b[0]}-{b[1] - 1}, {b[1] - b[0]} rows) is shorter than input_len + horizon = "
                f"{self.input_len + self.horizon}; use a longer file, other fractions/borders, or a shorter window"
            )
        self.borders = b
        return b

    # ---------------------------------------------------------------------------------- state
    def fit_state(self) -> dict[str, Any]:
        values, cols, stamps = self._read("train")
        b = self._borders()
        train = values[b[0] : b[1]].astype(np.float64)
        mean, std = train.mean(0), train.std(0)
        std = np.where(std > 0, std, 1.0)
        state = {"columns": cols, "mean": mean.tolist(), "std": std.tolist(), "input_len": self.input_len, "horizon": self.horizon}
        if self.cycle_opt is not None:
            state["cycle"] = self._fit_cycle((train - mean) / std, stamps[b[0] : b[1]] if stamps is not None else None)
        return state

    def _fit_cycle(self, z: np.ndarray, stamps: np.ndarray | None) -> dict[str, Any]:
        """The training rows' mean standardised value per phase of the cycle, per channel."""
        from ..data.time_series import row_spacing

        where = f"{os.fspath(self.sources['train'])!r}"
        if stamps is None:
            raise ValueError(f"cycle {self.cycle_opt!r} needs timestamps to place rows in the cycle, and {where} has no time_column {self.time_column!r}; set time_column or cycle: null")
        step = int(row_spacing(stamps).astype("timedelta64[s]").astype(np.int64))
        period = self._cycle_rows(step, where)
        phase = _phases(stamps, step, period)
        if len(np.unique(phase)) < period:
            raise ValueError(f"cycle of {period} rows: the training rows of {where} do not cover every phase of it; use a shorter cycle or a longer training part")
        level = np.stack([z[phase == k].mean(0) for k in range(period)])
        return {"period": period, "step_s": step, "level": level.tolist()}

    def _cycle_rows(self, step: int, where: str) -> int:
        """The ``cycle`` option in rows ``step`` seconds apart."""
        if isinstance(self.cycle_opt, int):
            return self.cycle_opt
        period = _duration_s(self.cycle_opt) / step
        if period != int(period) or period < 2:
            raise ValueError(f"cycle {self.cycle_opt!r} is {period:g} rows of {where}'s {step} s spacing; expected a whole number of rows >= 2")
        return int(period)

    def apply_state(self, state: Mapping[str, Any]) -> None:
        for key in ("input_len", "horizon"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"the checkpoint's model was trained with {key} {state[key]}; this run has {getattr(self, key)}; "
                    f"drop the override (or set data.init_args.{key}: {state[key]})"
                )
        self.columns = list(state["columns"])
        self.mean, self.std = np.asarray(state["mean"], np.float64), np.asarray(state["std"], np.float64)
        self.cycle = state.get("cycle")
        same = (self.cycle is None) == (self.cycle_opt is None)
        if same and self.cycle is not None:
            same = self._cycle_rows(self.cycle["step_s"], f"{os.fspath(self.sources['train'])!r}") == self.cycle["period"]
        if not same:
            had = f"cycle {self.cycle['period']} rows" if self.cycle else "no cycle"
            raise ValueError(f"the checkpoint's model was trained with {had}; this run has cycle {self.cycle_opt!r}; set data.init_args.cycle as it was trained")
        self.datasets.clear()

    def _season(self, times: np.ndarray | None, where: str) -> np.ndarray:
        """The saved cycle's level ``[len(times), C]`` at those times."""
        if times is None:
            raise ValueError(f"{where!r} has no time_column {self.time_column!r}; the model removes a cycle, which needs each row's timestamp")
        return np.asarray(self.cycle["level"], np.float64)[_phases(times, self.cycle["step_s"], self.cycle["period"])]

    @property
    def model_info(self) -> dict[str, Any]:
        return {"tokenizers": {"time_series": {"num_channels": len(self.columns)}}, "horizon": self.horizon, "input_len": self.input_len}

    def _carve_hint(self, split: str) -> str:
        return ", or set split / fractions / borders to cut it from the training series"

    # ---------------------------------------------------------------------------------- build
    def build_split(self, split: str) -> None:
        from ..data.time_series import collate_series, row_spacing

        L, H = self.input_len, self.horizon
        own = split != "train" and self.sources[split] is not None
        src_split = split if own else "train"
        values, cols, stamps = self._read(src_split)
        if own:
            missing = [c for c in self.columns if c not in cols]
            if missing:
                raise ValueError(f"{split} file {self.sources[split]!r} lacks column(s) {missing} the model was trained on; it has {cols}")
            values = values[:, [cols.index(c) for c in self.columns]]
        elif cols != self.columns:
            raise ValueError(f"the training series' columns {cols} differ from the checkpoint's {self.columns}")
        n = len(values)
        if own:
            lo, hi, step = 0, n, self.eval_step
        else:
            b = self._borders()
            lo, hi, step = {"train": (b[0], b[1], self.train_step), "val": (b[1] - L, b[2], self.eval_step), "test": (b[2] - L, b[3], self.eval_step)}[split]
        lo = max(lo, 0)
        if split == "predict":
            starts = list(range(lo, hi - L + 1, step))
            if starts and starts[-1] != hi - L:
                starts.append(hi - L)
        else:
            starts = list(range(lo, hi - L - H + 1, step))
        z = ((values - self.mean) / self.std).astype(np.float32)
        series = torch.from_numpy(np.concatenate([z, np.full((H, z.shape[1]), np.nan, np.float32)]))  # NaN future beyond the end
        self.collates = {"time_series": collate_series}
        ds = mds.arrays_dataset(np.asarray(starts, dtype=np.int64), None, "start").add_column("index", list(range(len(starts))))

        where = self.sources[src_split]
        times = None  # each row's time, then H more past the end at the file's spacing (forecasts beyond it)
        if stamps is not None:
            spacing, last = row_spacing(stamps), np.datetime64(stamps[-1], "s")
            after = last + spacing * np.arange(1, H + 1) if spacing is not None else np.full(H, last)  # one row: no window anyway
            times = np.concatenate([stamps.astype("datetime64[s]"), after])

        def window(t, series=series):
            return series[int(t) : int(t) + L]

        if self.cycle is not None:  # each window with the cycle's level at its input and forecast steps
            level = torch.from_numpy(self._season(times, where).astype(np.float32))

            def window(t, series=series, level=level):
                return {"series": series[int(t) : int(t) + L], "season": level[int(t) : int(t) + L + H]}

        def future(t, series=series):
            return series[int(t) + L : int(t) + L + H]

        self.datasets[split] = mds.lazy_preprocess(ds, {"time_series": ("start", window), "target": ("start", future)}, ("index",))
        if times is not None:

            def stamp(r: int) -> str:
                return str(np.datetime_as_string(times[r]))

            self.names[split] = [stamp(t) for t in starts]
            self.row_info[split] = {"start_row": starts, "forecast_start": [stamp(t + L) for t in starts]}
        else:
            self.names[split] = [f"row {t}" for t in starts]
            self.row_info[split] = {"start_row": starts, "forecast_start_row": [t + L for t in starts]}
        if not starts:
            self._why_empty[split] = (
                f"{where!r} rows {lo}-{hi - 1} hold no window of input_len + horizon = {L + H} rows" if own or split == "train"
                else f"the {split} part of {where!r} (rows {lo}-{hi - 1}) holds no window of input_len + horizon = {L + H} rows"
            )


def _duration_s(text: str) -> float:
    """Seconds in a duration such as ``1D`` or ``24h`` (pandas offsets)."""
    import pandas as pd

    try:
        return pd.Timedelta(text).total_seconds()
    except ValueError:
        raise ValueError(f"cycle {text!r} is not a duration; expected e.g. '1D', '24h', '7D' or a number of rows") from None


def _phases(stamps: np.ndarray, step_s: int, period: int) -> np.ndarray:
    """Each timestamp's phase in a cycle of ``period`` rows ``step_s`` seconds apart (phase 0 at the Unix epoch)."""
    secs = np.asarray(stamps, "datetime64[s]").astype(np.int64)
    return (np.floor_divide(secs, step_s) % period).astype(np.int64)


# ---------------------------------------------------------------------------------------- pairs
class PairedDataModule(MMTEDataModule):
    """Two single-modality DataModules paired by label, split by split: every item of ``first`` is
    matched with an item of ``second`` that has the same label (a seeded cycle through them).

    E.g. each spoken digit (FSDD, a :class:`FolderDataModule`) with a handwritten digit image of the
    same digit (scikit-learn digits, an :class:`ArrayDataModule`). Batches hold both modalities and
    ``label``.

    Args:
        first: the DataModule whose items are enumerated.
        second: the DataModule items are drawn from; its class names must equal first's.
        **kwargs: :class:`MMTEDataModule` options (batching, seed).
    """

    def __init__(self, first: MMTEDataModule, second: MMTEDataModule, **kwargs: Any):
        super().__init__(**kwargs)
        for name, dm in (("first", first), ("second", second)):
            if not isinstance(dm, MMTEDataModule) or not hasattr(dm, "modality"):
                raise TypeError(f"{name} must be a single-modality MMTEDataModule (Folder/Array); got {type(dm).__name__}")
        if first.modality == second.modality:
            raise ValueError(f"paired modalities must differ; both are {first.modality!r}")
        self.first, self.second = first, second
        self._init_state()

    def fit_state(self) -> dict[str, Any]:
        return {"first": self.first.state_dict(), "second": self.second.state_dict()}

    def apply_state(self, state: Mapping[str, Any]) -> None:
        self.first.load_state_dict(state["first"])
        self.second.load_state_dict(state["second"])
        if self.first.class_names != self.second.class_names:
            raise ValueError(f"cannot pair by label: class names differ ({self.first.class_names} vs {self.second.class_names})")
        self.class_names = self.first.class_names
        self.datasets.clear()

    def collates_for(self, split: str) -> dict[str, Callable]:
        return {**self.first.collates_for(split), **self.second.collates_for(split)}

    def build_split(self, split: str) -> None:
        if split not in SPLITS:
            raise ValueError(f"PairedDataModule has no {split!r} split; it has {SPLITS}")
        a_mod, b_mod = self.first.modality, self.second.modality
        da, db = self.first._ensure(split), self.second._ensure(split)
        self.collates = {**self.first.collates, **self.second.collates}
        if da is None or db is None or len(da) == 0 or len(db) == 0:
            self.datasets[split] = []
            self._why_empty[split] = (f"first: {self.first._why_empty.get(split, 'empty')}" if da is None or len(da) == 0
                                      else f"second: {self.second._why_empty.get(split, 'empty')}")
            return
        la, lb = _labels(da), _labels(db)
        pairs = mds.pair_by_label(la, lb, self.seed + SPLITS.index(split))
        ds = mds.arrays_dataset(np.asarray([p[0] for p in pairs]), None, "a").add_column("b", [p[1] for p in pairs])
        ds = ds.add_column("label", [la[i] for i, _ in pairs]).add_column("index", list(range(len(pairs))))

        def get_a(i, da=da):
            return da[int(i)][a_mod]

        def get_b(i, db=db):
            return db[int(i)][b_mod]

        self.datasets[split] = mds.lazy_preprocess(ds, {a_mod: ("a", get_a), b_mod: ("b", get_b)}, ("label", "index"))
        na, nb = self.first.names.get(split, []), self.second.names.get(split, [])
        self.names[split] = [f"{na[i] if na else i}|{nb[j] if nb else j}" for i, j in pairs]

    def empty_message(self, split: str) -> str:
        name = self.predict_split if split == "predict" else split
        why = self._why_empty.get(name, "it has no items")
        return (f"the {name!r} split is empty ({why}); set it on the paired DataModules, e.g. "
                f"--data.init_args.first.init_args.{name}_regex or their {name}_fraction")


def _labels(ds) -> list[int]:
    """A preprocessed dataset's labels without running its transform."""
    raw = ds.with_format(None)
    col = raw["label"]
    return [int(v) for v in (col.tolist() if hasattr(col, "tolist") else col)]
