"""Hugging Face datasets as a DataModule: hub cache, ``save_to_disk`` folders, parquet/arrow/csv/json files and
the ``audiofolder``/``imagefolder``/``webdataset`` builders; map-style or streamed."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import torch
from torch.utils.data import DataLoader

from ...data import collate_batch
from ...data import datasets as mds
from ...data import hf_source as hfs
from ...data.splits import carve_splits
from ...tokenizers.registry import get_modality
from .base import SPLITS, IndexedItems, MMTEDataModule, preprocess_fn
from .folder import _cropping_collate
from .hf_stream import StreamedSplit, StreamLoader

logger = logging.getLogger(__name__)

__all__ = ["HFDataModule"]

_DEFAULT_SPLITS = {"val": ("validation", "valid", "val", "dev"), "test": ("test",)}


def _audio_fn(opts: Mapping[str, Any], min_frames: int | None, augment: Any, what: str) -> Callable[[Any], torch.Tensor]:
    """An ``Audio`` cell -> fbank ``[T, F]``, as :func:`~mmte.training.data.base.preprocess_fn` makes it from a file."""
    from ...data.audio import preprocess_audio

    make = augment.fbank if augment is not None else preprocess_audio

    def call(value):
        w, sr = hfs.decode_audio(value, what)
        fb = make(w, sample_rate=sr, **opts)
        if min_frames and fb.shape[0] < min_frames:  # very short clips: repeat the last frame up to one patch
            fb = torch.cat([fb, fb[-1:].expand(min_frames - fb.shape[0], -1)], 0)
        return fb

    return call


def _prepare(batch: dict[str, list[Any]], fns: Mapping[str, tuple[Any, Callable]], label: tuple[str, str, dict | None] | None,
             index_column: str | None, to_numpy: bool) -> dict[str, list[Any]]:
    """Raw columns -> model columns: ``{modality: [...], "label" | "target": [...], ("index")}``."""
    out: dict[str, list[Any]] = {}
    for modality, (cols, fn) in fns.items():
        if isinstance(cols, list):  # tabular: the schema encodes the block's frame at once
            out[modality] = fn({c: batch[c] for c in cols})
        else:
            out[modality] = [fn(v) for v in batch[cols]]
        if to_numpy:
            out[modality] = [v.numpy() if isinstance(v, torch.Tensor) else v for v in out[modality]]
    if label is not None:
        col, key, index = label
        if col in batch:
            vals = batch[col]
            if index is None:
                out[key] = [float(v) for v in vals]
            else:
                index, strict = index
                out[key] = [index.get(str(v), -1) if v is not None else -1 for v in vals]
                if strict and -1 in out[key]:
                    raise ValueError(f"label {vals[out[key].index(-1)]!r} in column {col!r} is not a training class (known: {sorted(index)[:10]})")
    if index_column is not None:
        out["index"] = [int(v) for v in batch[index_column]]
    return out


def _tabular_fn(schema_state: Mapping[str, Any]) -> Callable[[dict[str, list[Any]]], list[dict[str, Any]]]:
    import pandas as pd

    from ...data.tabular import TableSchema

    schema = TableSchema.from_state(schema_state)

    def call(columns):
        num, cat = schema.encode(pd.DataFrame(columns), "data")
        parts = {"numeric": torch.from_numpy(num), "categorical": torch.from_numpy(cat)}
        parts = {k: v for k, v in parts.items() if v.shape[1] > 0}
        return [{k: v[i] for k, v in parts.items()} for i in range(len(num))]

    return call


class HFDataModule(MMTEDataModule):
    """A Hugging Face dataset (``datasets``) as training, evaluation and prediction data.

    ``path`` is a ``save_to_disk`` folder, a builder name (``parquet``, ``arrow``, ``csv``, ``json``,
    ``audiofolder``, ``imagefolder``, ``webdataset``) with ``data_files`` / ``data_dir``, a file or glob of
    data files, or a hub id read from the local Hugging Face cache (``HF_HUB_OFFLINE=1`` works). ``columns``
    says which column feeds which modality; each is decoded through its ``datasets`` feature (``Image``;
    ``Audio``: with torchcodec where FFmpeg's libraries load, else the cell's bytes are read with soundfile,
    as mmte reads files: ``audio_decoder``) and then mmte's preprocessing for that modality, with the same
    options (``preprocess``, ``augment``, ``min_frames``, ``max_frames``, ``crop``) as
    :class:`~mmte.training.data.FolderDataModule`, so a recipe switches its data source by replacing
    ``class_path`` and the source options.

    Splits are the dataset's own by name (``train_split``, ``val_split``, ``test_split``; a ``validation`` /
    ``test`` split is used when present and no name is given), or carved out of the training split when it
    has no such split: a ``split_column``, whole groups of a ``group_column`` (``val_groups`` /
    ``test_groups``, or fractions of the groups), or stratified fractions. ``test`` / ``predict`` may name
    another dataset; with ``state_from`` (set from ``--ckpt_path``) the training run's class map and
    scalers are reused.

    Map-style splits are preprocessed once with ``Dataset.map`` (cached by ``datasets``' fingerprint; in
    ``cache_dir`` when set), except an augmented training split, which is decoded per item. With
    ``streaming: true`` the training split is an ``IterableDataset`` read shard by shard, shuffled by
    shards and a ``shuffle_buffer`` seeded per epoch, split over the data-parallel ranks with
    ``datasets.distributed.split_dataset_by_node`` and resumable mid-epoch (:mod:`.hf_stream`);
    evaluation splits are read whole (they are small).

    Args:
        path: the dataset (see above).
        name: the dataset's configuration.
        data_files: a builder's files: a glob, a list, or ``{split: files}``.
        data_dir: a builder's folder (``audiofolder`` / ``imagefolder``).
        columns: ``{modality: column}`` (``tabular``: a list of numeric/categorical columns), e.g. ``{audio: audio}``.
        label_column: the target column (a ``ClassLabel``'s names become the class names); optional in predict data.
        id_column: a column of row ids for prediction files (default: the row's position).
        task: ``classification`` (labels: a ``ClassLabel``, strings or integers) or ``regression`` (a number).
        class_names: the class names, in id order (default: the ``ClassLabel``'s, else the training labels sorted).
        train_split: the dataset's training split.
        val_split: the dataset's validation split (default: ``validation``/``valid``/``val``/``dev`` if present, else carved).
        test_split: the dataset's test split (default: ``test`` if present, else carved by ``test_fraction``).
        predict_split: ``mmte predict``'s data: one of ``train``/``val``/``test`` (mmte's splits) or a split of the dataset by name.
        split_column: a column saying each training row's split (train, val/valid/validation, test).
        group_column: a column of groups (e.g. the speaker); held-out splits then take whole groups.
        val_groups: groups held out for validation (with ``group_column``).
        test_groups: groups held out for test (with ``group_column``).
        test: another dataset (any ``path`` form) for ``mmte test``; its ``test_split`` or its only split.
        predict: another dataset for ``mmte predict``; its only split (or ``predict_split`` when it names one of its splits).
        streaming: stream the training split instead of reading it map-style.
        shuffle_buffer: streaming: rows in the shuffle buffer (0: shard order only).
        state_rows: streaming: training rows the fitted state (class names of string labels, table scalers) is fitted on.
        preprocess: the modality's preprocessing options (several modalities: ``{modality: options}``).
        min_frames: audio: pad shorter fbanks by repeating the last frame.
        max_frames: audio: longest clip in frames; longer ones are cropped as ``crop`` says.
        crop: audio: ``start``, ``center`` or ``random`` (random in training, centre in evaluation).
        augment: audio: training-split augmentation (:mod:`mmte.data.augment`).
        audio_decoder: ``auto``, ``datasets`` (torchcodec) or ``soundfile``.
        num_proc: processes of the one-off ``Dataset.map`` preprocessing (None: this process).
        map_preprocess: preprocess map-style splits once with ``Dataset.map`` (False: per item, lazily).
        **kwargs: :class:`MMTEDataModule` options (``batch_size``, ``seed``, ``val_fraction``, ...).
    """

    _source_kinds = "dataset path|folder|files"

    def __init__(
        self,
        path: str | None = None,
        name: str | None = None,
        data_files: str | list[str] | dict[str, Any] | None = None,
        data_dir: str | None = None,
        columns: dict[str, str | list[str]] | None = None,
        label_column: str | None = "label",
        id_column: str | None = None,
        task: str = "classification",
        class_names: list[str] | None = None,
        train_split: str = "train",
        val_split: str | None = None,
        test_split: str | None = None,
        predict_split: str = "val",
        split_column: str | None = None,
        group_column: str | None = None,
        val_groups: list[str] | None = None,
        test_groups: list[str] | None = None,
        test: str | None = None,
        predict: str | None = None,
        streaming: bool = False,
        shuffle_buffer: int = 1000,
        state_rows: int = 10000,
        preprocess: dict[str, Any] | None = None,
        min_frames: int | None = 16,
        max_frames: int | None = None,
        crop: str = "start",
        augment: dict[str, Any] | None = None,
        audio_decoder: str = "auto",
        num_proc: int | None = None,
        map_preprocess: bool = True,
        **kwargs: Any,
    ):
        self.hf_predict_split = None if predict_split in SPLITS else predict_split
        super().__init__(predict_split=predict_split if predict_split in SPLITS else "val", **kwargs)
        from ...data.audio import CROPS
        from ...data.augment import AudioAugment

        if not columns or not isinstance(columns, Mapping):
            raise ValueError(f"columns must map each modality to its column, e.g. {{audio: audio}}; got {columns!r}")
        for m in columns:
            get_modality(m)  # an unknown modality fails now
        if task not in ("classification", "regression"):
            raise ValueError(f"task must be 'classification' or 'regression'; got {task!r}")
        if crop not in CROPS:
            raise ValueError(f"crop must be one of {CROPS}; got {crop!r}")
        if augment and "audio" not in columns:
            raise ValueError(f"augment is for audio; columns feed {sorted(columns)}")
        if (val_groups or test_groups) and group_column is None:
            raise ValueError("val_groups / test_groups need group_column (the column of each row's group, e.g. the speaker)")
        if not isinstance(shuffle_buffer, int) or shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must be an int >= 0; got {shuffle_buffer!r}")
        self.path, self.name, self.data_files, self.data_dir = path, name, data_files, data_dir
        self.columns = {m: (list(c) if isinstance(c, (list, tuple)) else c) for m, c in columns.items()}
        self.label_column, self.id_column, self.task, self.given_class_names = label_column, id_column, task, class_names
        self.train_split, self.val_split, self.test_split = train_split, val_split, test_split
        self.split_column, self.group_column = split_column, group_column
        self.val_groups = None if val_groups is None else [str(g) for g in val_groups]
        self.test_groups = None if test_groups is None else [str(g) for g in test_groups]
        self.streaming, self.shuffle_buffer, self.state_rows = bool(streaming), shuffle_buffer, state_rows
        multi = len(self.columns) > 1 or (preprocess and set(preprocess) <= set(self.columns) and all(isinstance(v, Mapping) for v in preprocess.values()))
        self.preprocess = {m: dict((preprocess or {}).get(m) or {}) for m in self.columns} if multi else {m: dict(preprocess or {}) for m in self.columns}
        self.min_frames, self.max_frames, self.crop = min_frames, max_frames, crop
        self.augment, self._augment = augment, AudioAugment.from_config(augment)
        self.audio_decoder = hfs.audio_reader(audio_decoder) if "audio" in self.columns else audio_decoder
        self.num_proc, self.map_preprocess = num_proc, map_preprocess
        self.sources = {"train": path, "val": None, "test": test, "predict": predict if predict is not None else (path if self.hf_predict_split else None)}
        self._opened: dict[str, dict[str, Any]] = {}
        self._assign: dict[str, list[int]] | None = None
        self.schema_state: dict[str, Any] | None = None
        if "audio" in self.columns:
            logger.info("audio column %r decoded by %s", self.columns["audio"],
                        "datasets (torchcodec)" if self.audio_decoder == "datasets" else "soundfile from its bytes/path (torchcodec/FFmpeg not used)")
        if self.state_from is None:
            if path is None:
                raise ValueError("HFDataModule needs a dataset: set path (a save_to_disk folder, a builder with data_files, data files or a hub id)")
            self._check(self._train_raw(), "train", require_label=True)
        for s in ("test", "predict"):
            if self.sources[s] is not None and self.sources[s] != path:
                self._check(self._raw(s), s, require_label=s == "test")
        self._init_state()

    # ------------------------------------------------------------------------------- opening
    def _open(self, source: str, streaming: bool | None = None) -> dict[str, Any]:
        """``source``'s splits; the main dataset is opened as streamed when ``streaming`` is on (None: as the module
        reads it), so a streamed run never prepares the whole dataset as an Arrow table first."""
        if streaming is None:
            streaming = self.streaming and source == self.path
        key = f"{source}|{streaming}"
        if key not in self._opened:
            same = source == self.path
            self._opened[key] = hfs.load_source(source, self.name if same else None, self.data_files if same else None,
                                                self.data_dir if same else None, streaming=streaming, option="path" if same else "test/predict")
        return self._opened[key]

    def _named(self, splits: Mapping[str, Any], wanted: str, where: str, option: str) -> Any:
        if wanted not in splits:
            raise ValueError(f"dataset {where!r} has no split {wanted!r} ({option}); it has {sorted(splits)}")
        return splits[wanted]

    def _own_split(self, split: str) -> str | None:
        """The main dataset's split that ``split`` (val/test) reads, or None when it is carved out of train."""
        explicit = getattr(self, f"{split}_split")
        splits = self._open(self.path)
        if explicit is not None:
            self._named(splits, explicit, self.path, f"{split}_split")
            return explicit
        return next((s for s in _DEFAULT_SPLITS[split] if s in splits and s != self.train_split), None)

    def _train_raw(self) -> Any:
        return self._named(self._open(self.path), self.train_split, self.path, "train_split")

    def _raw(self, split: str) -> Any:
        """The raw rows of ``split``'s own source (test/predict: another dataset, or a split by name)."""
        src = self.sources[split]
        if split == "predict" and src == self.path:
            return self._named(self._open(self.path), self.hf_predict_split, self.path, "predict_split")
        splits = self._open(src)
        if split == "test" and self.test_split in splits:
            return splits[self.test_split]
        if split == "predict" and self.hf_predict_split in splits:
            return splits[self.hf_predict_split]
        if len(splits) != 1:
            raise ValueError(f"{split} dataset {src!r} has splits {sorted(splits)}; name the one to use with {split}_split")
        return next(iter(splits.values()))

    def _check(self, ds: Any, split: str, require_label: bool) -> None:
        """One line for a missing column, naming the dataset, the column and the columns there are."""
        have = list(ds.column_names or ds.features or [])
        if not have:  # a stream that does not know its columns before reading: its first rows will tell
            return
        where = self.sources[split] if split in ("test", "predict") else self.path
        need = [(f"columns.{m}", c) for m, cs in self.columns.items() for c in (cs if isinstance(cs, list) else [cs])]
        need += [("id_column", self.id_column)] if self.id_column else []
        if split == "train":
            need += [(o, getattr(self, o)) for o in ("split_column", "group_column") if getattr(self, o)]
        if require_label and self.label_column:
            need.append(("label_column", self.label_column))
        for option, col in need:
            if col not in have:
                raise ValueError(f"dataset {where!r} ({split}) has no column {col!r} ({option}); it has {have}")
        feats = ds.features or {}
        for m, col in self.columns.items():
            f = feats.get(col) if isinstance(col, str) else None
            if m == "audio" and f is not None and type(f).__name__ not in ("Audio", "Value"):
                raise ValueError(f"dataset {where!r}: column {col!r} (columns.audio) is a {type(f).__name__}; expected an Audio feature or file paths")
            if m == "audio" and type(f).__name__ == "Value" and f.dtype not in ("string", "large_string"):
                raise ValueError(f"dataset {where!r}: column {col!r} (columns.audio) holds {f.dtype}; expected an Audio feature or file paths")
            if m == "image" and f is not None and type(f).__name__ not in ("Image", "Array2D", "Array3D", "List", "Sequence", "Value", "LargeList"):
                raise ValueError(f"dataset {where!r}: column {col!r} (columns.image) is a {type(f).__name__}; expected an Image feature, arrays or paths")
        if self.task == "classification" and require_label and self.label_column in feats:
            f = feats[self.label_column]
            if type(f).__name__ == "Value" and f.dtype.startswith(("float", "double")):
                raise ValueError(f"dataset {where!r}: label column {self.label_column!r} holds {f.dtype} numbers, not categories; "
                                 f"use a ClassLabel, string or integer column for classification, or task: regression")

    def _decodable(self, ds: Any) -> Any:
        """``ds`` with its audio column read as bytes/path (soundfile) or at the preprocessing rate (torchcodec)."""
        import datasets

        col = self.columns.get("audio")
        if col is None or type((ds.features or {}).get(col)).__name__ != "Audio":
            return ds
        if self.audio_decoder == "datasets":
            return ds.cast_column(col, datasets.Audio(sampling_rate=int(self.preprocess["audio"].get("target_rate", 16000))))
        return ds.cast_column(col, datasets.Audio(decode=False))

    # -------------------------------------------------------------------------------- splits
    def _assignment(self) -> dict[str, list[int]]:
        """Training-split rows of train and of the val/test splits carved out of it."""
        if self._assign is not None:
            return self._assign
        ds = self._train_raw()
        n = len(ds)
        selected: dict[str, list[int]] = {}
        fraction: dict[str, float] = {}
        carve = [s for s in ("test", "val") if self._own_split(s) is None]
        groups = [str(g) for g in ds[self.group_column]] if self.group_column else None
        if self.group_column:
            known = set(groups)
            for opt, gl in (("val_groups", self.val_groups), ("test_groups", self.test_groups)):
                unknown = sorted(set(gl or []) - known)
                if unknown:
                    raise ValueError(f"{opt} {unknown} are not groups of column {self.group_column!r} of dataset {self.path!r}; it has {sorted(known)}")
        split_col = [str(v).lower() for v in ds[self.split_column]] if self.split_column else None
        for s in carve:
            chosen = getattr(self, f"{s}_groups")
            if split_col is not None:
                names = {"val": ("val", "valid", "validation"), "test": ("test",)}[s]
                selected[s] = [i for i, v in enumerate(split_col) if v in names]
                self._why_empty[s] = f"split_column {self.split_column!r} names no {s} row"
            elif chosen is not None:
                selected[s] = [i for i, g in enumerate(groups) if g in set(chosen)]
                self._why_empty[s] = f"{s}_groups {chosen} hold no row"
            else:
                fraction[s] = getattr(self, f"{s}_fraction")
                self._why_empty[s] = f"the dataset has no {s} split and {s}_fraction is {fraction[s]}"
        labels = [str(v) for v in ds[self.label_column]] if self.task == "classification" and fraction and groups is None else None
        out = carve_splits(n, selected, fraction, self.seed, groups=groups, labels=labels)
        if split_col is not None:
            out["train"] = [i for i in out["train"] if split_col[i] == "train"]
        self._why_empty["train"] = f"every row of split {self.train_split!r} went to the held-out splits"
        self._assign = out
        return out

    def _carve_hint(self, split: str) -> str:
        return f", or set {split}_split / split_column / {split}_groups / {split}_fraction"

    def _rows(self, split: str) -> Any:
        """The raw (map-style) rows of an mmte split."""
        if split == "predict" or (split == "test" and self.sources["test"] is not None):
            return self._raw(split)
        own = self._own_split(split) if split in ("val", "test") else None
        if own is not None:
            return self._open(self.path)[own]
        if self.streaming and split != "train":
            raise ValueError(f"a streamed dataset's {split} split must be a split of its own ({split}_split); carving needs the rows in one table")
        return self._train_raw().select(self._assignment()[split])

    # ---------------------------------------------------------------------------------- state
    def fit_state(self) -> dict[str, Any]:
        ds = self._state_rows()
        state: dict[str, Any] = {"columns": self.columns, "task": self.task, "label_column": self.label_column, "class_names": None, "schema": None}
        if self.task == "classification":
            names = self.given_class_names or hfs.class_names_of((ds.features or {}).get(self.label_column))
            state["class_names"] = [str(c) for c in names] if names else mds.sort_labels([str(v) for v in ds[self.label_column] if v is not None])
        if "tabular" in self.columns:
            from ...data.tabular import TableSchema

            cols = self.columns["tabular"]
            if not isinstance(cols, list):
                raise ValueError(f"columns.tabular must be a list of the table's feature columns; got {cols!r}")
            state["schema"] = TableSchema().fit(ds.select_columns(cols).to_pandas(), cols).state()
        return state

    def _state_rows(self) -> Any:
        if not self.streaming:
            return self._rows("train")
        import datasets

        stream = self._open(self.path, streaming=True)
        rows = list(self._named(stream, self.train_split, self.path, "train_split").take(self.state_rows))
        logger.info("streamed training split: state (class names, scalers) fitted on its first %d rows", len(rows))
        cols = [c for c in (self.label_column, *(self.columns.get("tabular") or [])) if c and rows and c in rows[0]]
        feats = self._named(stream, self.train_split, self.path, "train_split").features
        ds = datasets.Dataset.from_dict({c: [r[c] for r in rows] for c in cols})
        if feats is not None and self.label_column in feats and hfs.class_names_of(feats[self.label_column]):
            ds = ds.cast_column(self.label_column, feats[self.label_column])
        return ds

    def apply_state(self, state: Mapping[str, Any]) -> None:
        for key in ("task", "label_column"):
            if state.get(key, getattr(self, key)) != getattr(self, key):
                raise ValueError(f"the checkpoint's model was trained with {key} {state[key]!r}; this run has {getattr(self, key)!r}")
        if sorted(state.get("columns", self.columns)) != sorted(self.columns):
            raise ValueError(f"the checkpoint's model reads modalities {sorted(state['columns'])}; columns here feed {sorted(self.columns)}")
        super().apply_state(state)
        self.schema_state = state.get("schema")
        self.datasets.clear()

    @property
    def model_info(self) -> dict[str, Any]:
        info = dict(super().model_info) if self.task == "classification" else {"out_dim": 1}
        if "audio" in self.columns:
            info["audio_frontend"] = self.preprocess["audio"].get("frontend", "kaldi")
        if self.schema_state is not None:
            s = self.schema_state
            info["tokenizers"] = {"tabular": {"num_numeric": len(s["numeric"]), "cardinalities": [len(s["vocab"][c]) for c in s["categorical"]]}}
        return info

    # ---------------------------------------------------------------------------------- build
    def collates_for(self, split: str) -> dict[str, Callable]:
        out = {m: get_modality(m).collate_fn for m in self.columns}
        if "audio" in out and self.max_frames is not None:
            mode = self.crop if split == "train" or self.crop != "random" else "center"
            out["audio"] = _cropping_collate(out["audio"], self.max_frames, mode)
        return out

    def _prepare_fn(self, split: str, ds: Any, to_numpy: bool) -> Callable[[dict[str, list[Any]]], dict[str, list[Any]]]:
        fns: dict[str, tuple[Any, Callable]] = {}
        where = self.sources[split] if split in ("test", "predict") and self.sources[split] else self.path
        for m, col in self.columns.items():
            if m == "audio":
                aug = self._augment if split == "train" else None
                fns[m] = (col, _audio_fn(self.preprocess[m], self.min_frames, aug, f"dataset {where!r} column {col!r}"))
            elif m == "tabular":
                fns[m] = (col, _tabular_fn(self.schema_state))
            else:
                fns[m] = (col, preprocess_fn(m, self.preprocess[m]))
        label = None
        cols = ds.column_names or list(ds.features or [])
        if self.label_column and self.label_column in cols:
            key = "label" if self.task == "classification" else "target"
            index = None
            if self.task == "classification":
                index = self._label_index(ds, split, where)
            label = (self.label_column, key, index)
        elif split != "predict":
            raise ValueError(f"dataset {where!r} ({split}) has no column {self.label_column!r} (label_column); it has {cols}")
        ids = self.id_column if self.streaming and split == "train" and self.id_column and self._int_ids(ds) else None
        return partial(_prepare, fns=fns, label=label, index_column=ids, to_numpy=to_numpy)

    def _int_ids(self, ds: Any) -> bool:
        f = (ds.features or {}).get(self.id_column)
        return type(f).__name__ == "Value" and str(f.dtype).startswith(("int", "uint"))

    def _label_index(self, ds: Any, split: str, where: str) -> tuple[dict[str, int], bool]:
        """Raw label value (as text; a ``ClassLabel``'s id) -> class id of the training class map, and whether a
        value outside it is an error (not in predict data, where its target is left empty)."""
        index = {c: i for i, c in enumerate(self.class_names or [])}
        names = hfs.class_names_of((ds.features or {}).get(self.label_column))
        out = {str(i): index[str(n)] for i, n in enumerate(names) if str(n) in index} if names is not None else dict(index)
        strict = split != "predict"
        if hasattr(ds, "select"):  # map-style: every value is checked now, one line naming them
            values = {str(v) for v in ds[self.label_column] if v is not None}
            bad = sorted(values - set(out))
            if bad and strict:
                shown = [names[int(b)] for b in bad] if names is not None else bad
                raise ValueError(f"dataset {where!r} ({split}) has label(s) {shown[:8]} in {self.label_column!r} that the training classes "
                                 f"{self.class_names} lack; remove those rows, or train with them")
            if bad:
                logger.warning("predict: %d label value(s) the model was not trained on; their target is left empty", len(bad))
        return out, strict

    def build_split(self, split: str) -> None:
        if self.streaming and split == "train":
            self._build_stream()
            return
        if split in ("val", "test") and self.sources.get(split) is None and self._own_split(split) is None and not self.split_column \
                and getattr(self, f"{split}_groups") is None and not getattr(self, f"{split}_fraction"):
            self._why_empty[split] = f"the dataset has no {split} split and {split}_fraction is {getattr(self, f'{split}_fraction')}"
            self.datasets[split], self.names[split] = [], []
            return
        ds = self._decodable(self._rows(split))
        if self.streaming and hasattr(ds, "take") and not hasattr(ds, "select"):  # an eval split of a stream: read whole
            import datasets

            rows = list(ds)  # cast after building: encoding an Audio feature row by row needs torchcodec, a cast does not
            ds = datasets.Dataset.from_list(rows).cast(ds.features) if rows else datasets.Dataset.from_dict({k: [] for k in ds.features}, features=ds.features)
        lazy = not self.map_preprocess or (split == "train" and self._augment is not None)
        fn = self._prepare_fn(split, ds, to_numpy=not lazy)
        n = len(ds)
        self.names[split] = [str(v) for v in ds[self.id_column]] if self.id_column else [str(i) for i in range(n)]
        if split == "predict":
            self._why_empty["predict"] = f"{self.sources['predict']!r} has no row"
        if n == 0:
            self.datasets[split] = []
            return
        if lazy:  # a fresh augmentation draw per item and epoch: never cached
            prepared = ds.with_transform(fn)
        else:
            kw: dict[str, Any] = {}
            if self.cache_dir:
                os.makedirs(self.cache_dir, exist_ok=True)
                kw["cache_file_name"] = os.path.join(self.cache_dir, f"mmte-hf-{mds._fingerprint(ds._fingerprint, split, self.preprocess, self.min_frames, self.class_names, self.schema_state)}.arrow")
            prepared = ds.map(fn, batched=True, batch_size=64, num_proc=self.num_proc, remove_columns=ds.column_names, desc=f"mmte preprocess {split}", **kw)
            prepared = prepared.with_format("torch")
        self.datasets[split] = IndexedItems(prepared)

    def _build_stream(self) -> None:
        from datasets.distributed import split_dataset_by_node

        stream = self._named(self._open(self.path, streaming=True), self.train_split, self.path, "train_split")
        self._check(stream, "train", require_label=True)
        if self.split_column:
            col = self.split_column
            stream = stream.filter(lambda r: str(r[col]).lower() == "train")
        stream = self._decodable(stream)
        known = self._known_rows()
        if self.shuffle_buffer:
            stream = stream.shuffle(seed=self.seed, buffer_size=self.shuffle_buffer)
        else:
            stream = stream.shuffle(seed=self.seed, buffer_size=1)  # the shards' order only
        replicas, rank = self.replicas()
        rows = None
        if replicas > 1:
            stream = split_dataset_by_node(stream, rank=rank, world_size=replicas)
            logger.info("streamed training split: rank %d of %d reads %s", rank, replicas,
                        f"shards {rank}, {rank + replicas}, ... of {stream.num_shards * replicas}" if stream.num_shards and known is not None else "every world_size-th row")
        if known is not None and not self.split_column:
            rows = known // replicas
            if known % replicas:
                logger.warning("streamed training split: %d rows over %d ranks; each rank takes %d a epoch (%d left out)", known, replicas, rows, known % replicas)
            stream = stream.take(rows)
        self.datasets["train"] = StreamedSplit(stream, self._prepare_fn("train", stream, to_numpy=False), rows=rows)
        self.names["train"] = []

    def _known_rows(self) -> int | None:
        """The training split's rows when the source says so without reading them (saved datasets, parquet metadata)."""
        if hfs.is_saved_dataset(self.path):  # memory-mapped as saved: its length costs no read
            return len(self._named(self._open(self.path, streaming=False), self.train_split, self.path, "train_split"))
        files = self.data_files
        if isinstance(files, Mapping):
            files = files.get(self.train_split)
        if files is None and self.path not in hfs.BUILDERS:
            files = self.path
        if files is None:
            return None
        import glob

        names = sorted({f for pat in ([files] if isinstance(files, str) else files) for f in glob.glob(os.fspath(pat), recursive=True)})
        if not names or not all(f.endswith(".parquet") for f in names):
            return None
        import pyarrow.parquet as pq

        return int(sum(pq.ParquetFile(f).metadata.num_rows for f in names))

    def loader(self, split: str, train: bool) -> DataLoader:
        ds = self._ensure(split)
        if not isinstance(ds, StreamedSplit):
            return super().loader(split, train)
        return StreamLoader(ds, seed=self.seed, batch_size=self.batch_size, num_workers=self.num_workers, persistent_workers=self.num_workers > 0,
                            collate_fn=partial(collate_batch, collates=self.collates_for("train")))

    def row_names(self, split: str) -> list[str]:
        self._ensure(split)
        split = self.prediction_split if split == "predict" else split
        return self.names.get(split, [])

