"""Files (audio, images, ...) from folders, files or globs as a DataModule, with labels from names or a CSV."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from ...data import datasets as mds
from ...data.normalize import group_moments, stream_moments
from ...data.splits import carve_splits, leave_one_group_out
from ...tokenizers.registry import get_modality
from .base import MMTEDataModule, preprocess_fn

logger = logging.getLogger(__name__)

__all__ = ["FolderDataModule", "group_folds"]


def _group_normed(fn: Callable[[Any], Any], stats: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> Callable[[Any], Any]:
    """``fn(path)`` standardised per mel bin by ``stats[path]`` (``group_norm``)."""

    def call(path):
        mean, std = stats[path]
        return (fn(path) - mean) / std

    return call


def _cropping_collate(collate: Callable, max_frames: int, mode: str) -> Callable:
    from ...data.audio import crop_frames

    def call(samples):
        return collate([crop_frames(s, max_frames, mode) for s in samples])

    return call


class FolderDataModule(MMTEDataModule):
    """Files (audio, images, ...) from folders, files or globs, with labels from the file names or a CSV.

    The training data is ``train`` (or ``data_dir``). A split with its own source (``val``, ``test``,
    ``predict``: a folder, a file or a glob) uses all of it; otherwise it is carved out of the training
    data, in this order: a file-name pattern (``val_regex`` / ``test_regex``), named groups
    (``val_groups`` / ``test_groups``, with ``group_regex``), then a fraction (of the groups when
    ``group_regex`` is set, so no speaker is in two splits; else of the files, stratified by label).
    Class ids come from the training split's labels and are saved with the model; evaluating on a subset
    of the classes works, and a label the training split never had is an error naming the file.

    For leave-one-group-out evaluation see :func:`group_folds`.

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
        from ...data.audio import CROPS
        from ...data.augment import AudioAugment

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
        selected: dict[str, list[int]] = {}
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
                selected[s] = [i for i, name in enumerate(names) if r.search(name)]
                self._why_empty[s] = f"{s}_regex {rx!r} matches no file of {where}"
            elif chosen is not None:
                selected[s] = [i for i, g in enumerate(groups) if g in set(chosen)]
                self._why_empty[s] = f"{s}_groups {chosen} hold no file of {where}"
            else:
                fraction[s] = getattr(self, f"{s}_fraction")
                self._why_empty[s] = f"no {s} source, {s}_regex or {s}_groups is set and {s}_fraction is {fraction[s]}"
        by_group = self.group_regex is not None
        out = carve_splits(len(names), selected, fraction, self.seed, groups=groups if by_group else None, labels=labels)
        if by_group and any(fraction.values()):
            for s in fraction:
                logger.info("%s split: group(s) %s held out (%d files)", s, sorted({groups[i] for i in out[s]}), len(out[s]))
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
        fn = preprocess_fn("audio", opts)
        mean, std = stream_moments(fn(p).double().numpy() for p in paths)
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
        self.preprocess_item = preprocess_fn(self.modality, opts, self.min_frames)  # one file -> one sample (with the saved state)
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
        plain, key = self.preprocess_item, (self.modality, self._effective_preprocess, self.min_frames)
        norm = self._group_stats(split, paths, names) if self.group_norm and len(ds) else None
        if norm is not None:
            plain, key = _group_normed(plain, norm), (*key, "group_norm")
        if len(ds) and split == "train" and self._augment is not None:  # a fresh draw per item and epoch: never cached
            fn = preprocess_fn(self.modality, self._effective_preprocess, self.min_frames, self._augment)
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
        groups = [m.group(1) if (m := rx.search(n)) else f"file:{n}" for n in names]
        stats = group_moments(list(paths), groups, lambda p: self.preprocess_item(p).double().numpy())
        out = {p: (torch.from_numpy(m).float(), torch.from_numpy(s).float()) for p, (m, s) in stats.items()}
        alone = sum(g.startswith("file:") for g in set(groups))
        logger.info("%s split: each clip standardised per mel bin by its group's statistics (group_norm): %d group(s)%s", split,
                    len(set(groups)) - alone, f", {alone} file(s) group_regex does not match, each by its own" if alone else "")
        return out

    def _report_crops(self, split: str, paths: Sequence[str]) -> None:
        if self.modality != "audio" or self.max_frames is None or not paths:
            return
        import soundfile as sf

        from ...data.audio import fbank_frames

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


def group_folds(**folder_kwargs: Any) -> Iterator[tuple[str, FolderDataModule]]:
    """Leave-one-group-out folds over a folder: one :class:`FolderDataModule` per group (``group_regex``'s
    first group, e.g. the speaker), with that group as the test split and the others for training (and
    validation, by ``val_groups`` / ``val_fraction`` of the remaining groups). The folds are
    :func:`mmte.data.splits.leave_one_group_out`'s.

    Example:
        ``for speaker, dm in group_folds(data_dir=..., pattern="*.wav", label_regex=r"^(\\d+)_",
        group_regex=r"^\\d+_([a-z]+)_", val_fraction=0.0): ...``

    Yields:
        ``(held-out group, DataModule)`` in sorted group order.
    """
    if not folder_kwargs.get("group_regex"):
        raise ValueError("group_folds needs group_regex (a pattern whose first group is a file's group)")
    base = FolderDataModule(**{**folder_kwargs, "val_fraction": 0.0, "test_fraction": 0.0, "val_regex": None, "test_regex": None,
                               "val_groups": None, "test_groups": None})
    for g, _, _ in leave_one_group_out(base._pool()["group"]):
        yield g, FolderDataModule(**{**folder_kwargs, "test_groups": [g]})
