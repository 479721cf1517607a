"""The DataModules' base class: sources, splits, loaders, collate, fitted state, ``model_info``.

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

**Shuffling and distributed runs.** Training shuffles with a permutation of (seed, epoch) and its loader
saves its position in every checkpoint, so a resumed run sees the same batches as an uninterrupted one.
Under data parallelism (``trainer.strategy.distributed_sampler_kwargs``) the DataModule shards by itself:
rank ``r`` of ``R`` takes every ``R``-th item of the same global permutation, so the union of the ranks'
batch ``k`` is one process's batch ``k`` when the per-rank batch size is the global one divided by ``R``;
evaluation splits are sharded the same way without padding, so every item is scored exactly once
(:mod:`mmte.training.data.samplers`).

**A new source** is one subclass: set ``self.sources``, call :meth:`MMTEDataModule._init_state` at the end
of ``__init__``, and implement :meth:`~MMTEDataModule.build_split` (fill ``self.datasets[split]`` with a
map-style dataset of model-format items, ``self.names[split]``, ``self.collates``); override
:meth:`~MMTEDataModule.fit_state` / :meth:`~MMTEDataModule.apply_state` when preprocessing learns from
data. A torch ``IterableDataset`` split (e.g. a streamed one, sharded by the subclass with
:meth:`~MMTEDataModule.replicas`) is loaded without a sampler; its loader's state is its own.

Everything that can be wrong with the inputs (a missing folder or file, a CSV without the named
columns, unreadable files, values that do not fit) is checked when the DataModule is constructed or a
split is built, so the ``mmte`` command fails with one line naming the file, row or option.
:attr:`MMTEDataModule.model_info` tells the model what the data determines (classes, channels,
horizon...); the CLI links it into ``model.data_info``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, IterableDataset

from ...data import collate_batch
from ...data import datasets as mds
from ...data.splits import split_indices
from ...tokenizers.registry import get_modality
from ..guards import ResumableDataLoader
from .samplers import ResumableLoader, eval_sampler, train_sampler
from .state import STATE_FORMAT, read_data_state

logger = logging.getLogger(__name__)

__all__ = ["SPLITS", "IndexedItems", "MMTEDataModule"]

SPLITS = ("train", "val", "test")


def preprocess_fn(modality: str, options: Mapping[str, Any] | None, min_frames: int | None = None, augment: Any = None) -> Callable[[Any], Any]:
    """The registry preprocessing of ``modality`` with ``options`` (``augment``: an audio augmenter's fbank instead);
    audio fbanks shorter than ``min_frames`` are padded by repeating their last frame."""
    spec = get_modality(modality)
    if spec.preprocess is None:
        raise ValueError(f"modality {modality!r} has no preprocessing registered; give ready tensors instead")
    fn = partial(augment.fbank if augment is not None else spec.preprocess, **dict(options or {}))
    if modality != "audio" or not min_frames:
        return as_array_input(fn)

    def audio(path):
        fb = fn(path)
        if fb.shape[0] < min_frames:  # very short clips: repeat the last frame up to one patch
            fb = torch.cat([fb, fb[-1:].expand(min_frames - fb.shape[0], -1)], 0)
        return fb

    return audio


def as_array_input(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``fn`` taking numpy arrays where Arrow hands back nested lists."""

    def call(value):
        if isinstance(value, list):  # Arrow hands nested lists back
            value = np.asarray(value, dtype=np.float32)
        return fn(value)

    return call


class IndexedItems(torch.utils.data.Dataset):
    """A prepared ``datasets.Dataset`` whose items also carry their position in the split (``index``)."""

    def __init__(self, ds: Any):
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {**self.ds[int(i)], "index": int(i)}


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

    def replicas(self) -> tuple[int, int]:
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

    def loader(self, split: str, train: bool) -> DataLoader:
        """The DataLoader of ``split``: sharded over the data-parallel ranks; ``train``: shuffled and resumable."""
        ds = self._ensure(split)
        if ds is None or (not isinstance(ds, IterableDataset) and len(ds) == 0):
            raise ValueError(self.empty_message(split))
        kw: dict[str, Any] = {
            "batch_size": self.batch_size if train else self.eval_batch_size,
            "collate_fn": partial(collate_batch, collates=self.collates_for("train" if train else "eval")),  # eval: no random crops
            "num_workers": self.num_workers,
            "persistent_workers": self.num_workers > 0,
        }
        if isinstance(ds, IterableDataset):  # a stream shards itself (replicas()); its loader keeps its position
            return ResumableLoader(ds, **kw)
        replicas, rank = self.replicas()
        if train:  # resumable: a run stopped mid-epoch (SIGTERM) continues with the batches it had not seen yet
            return ResumableDataLoader(ds, sampler=train_sampler(len(ds), self.seed, replicas, rank), drop_last=self.drop_last, **kw)
        return DataLoader(ds, sampler=eval_sampler(len(ds), replicas, rank), **kw)

    def train_dataloader(self) -> DataLoader:
        return self.loader("train", True)

    def val_dataloader(self) -> DataLoader:
        return self.loader("val", False)

    def test_dataloader(self) -> DataLoader:
        return self.loader("test", False)

    def predict_dataloader(self) -> DataLoader:
        return self.loader("predict", False)

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
        return split_indices(labels, self.val_fraction, self.test_fraction, self.seed)
