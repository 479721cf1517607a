"""Hugging Face datasets as a source: opening one (hub cache, ``save_to_disk`` folder, builder + files),
reading its features (class names of a ``ClassLabel``, which columns a modality can decode) and decoding
audio cells without FFmpeg.

``datasets`` 4+ decodes an ``Audio`` column with torchcodec, which needs FFmpeg's shared libraries. Where
torchcodec cannot load, the column is cast to ``Audio(decode=False)`` and each cell's bytes (or path) is
read with soundfile, as mmte reads audio files (:func:`mmte.data.audio.load_audio`): the same samples,
so the same fbanks as from the files themselves. The ``audiofolder`` builder of ``datasets`` 4+ encodes its
table with torchcodec too; where that cannot load, :func:`scan_audiofolder` builds the same dataset by
scanning the folder, its cells holding the files' paths.

Framework-free (no Lightning); :class:`mmte.training.data.HFDataModule` wraps it.
"""

from __future__ import annotations

import glob
import io
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)

__all__ = ["AUDIO_EXTENSIONS", "BUILDERS", "audio_reader", "class_names_of", "decode_audio", "is_saved_dataset", "load_source", "scan_audiofolder",
           "torchcodec_works"]

BUILDERS = ("parquet", "arrow", "csv", "json", "audiofolder", "imagefolder", "webdataset")
AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".mp3")  # what soundfile (libsndfile) reads of the audiofolder builder's list
_METADATA_FILES = ("metadata.csv", "metadata.jsonl", "metadata.parquet")
_EXT_BUILDER = {".parquet": "parquet", ".arrow": "arrow", ".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".tar": "webdataset"}


def is_saved_dataset(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``."""
    p = os.fspath(path)
    return os.path.isdir(p) and (os.path.isfile(os.path.join(p, "dataset_dict.json")) or os.path.isfile(os.path.join(p, "state.json")))


def _cache_folders() -> str:
    import datasets
    from huggingface_hub import constants

    return f"{constants.HF_HUB_CACHE} (hub) / {datasets.config.HF_DATASETS_CACHE} (datasets)"


def load_source(
    path: str | os.PathLike,
    name: str | None = None,
    data_files: str | Sequence[str] | Mapping[str, Any] | None = None,
    data_dir: str | None = None,
    streaming: bool = False,
    option: str = "path",
) -> dict[str, Any]:
    """Open a Hugging Face dataset: ``{split name: Dataset | IterableDataset}``.

    Args:
        path: a ``save_to_disk`` folder; a builder name (:data:`BUILDERS`) with ``data_files``/``data_dir``; a file
            or glob of parquet/arrow/csv/json files; a folder of data files; or a hub id read from the local cache
            (``HF_HUB_OFFLINE=1`` works).
        name: the dataset's configuration.
        data_files: files of a builder (a glob, a list, or ``{split: files}``).
        data_dir: a builder's folder (``audiofolder``/``imagefolder``: the folder of files and ``metadata.csv``).
        streaming: an ``IterableDataset`` per split, read shard by shard.
        option: the option's name, for the error messages.

    Raises:
        FileNotFoundError: a file, folder or glob that names nothing; a hub id that is not in the local cache.
        ValueError: a builder without files.
    """
    import datasets

    p = os.fspath(path)
    if is_saved_dataset(p):
        saved = datasets.load_from_disk(p)
        splits = dict(saved) if isinstance(saved, datasets.DatasetDict) else {"train": saved}
        if streaming:  # memory-mapped Arrow read as a stream of its shards
            splits = {k: v.to_iterable_dataset(num_shards=max(1, len(v.cache_files))) for k, v in splits.items()}
        return splits
    builder, files = None, data_files
    if p in BUILDERS:
        builder = p
        if data_files is None and data_dir is None:
            raise ValueError(f"{option} {p!r} is a builder; give data_files (files or a glob) or data_dir (a folder) to read")
    elif any(ch in p for ch in "*?[") or os.path.isfile(p):
        if not glob.glob(p, recursive=True):
            raise FileNotFoundError(f"{option} {p!r} matches no file; expected a save_to_disk folder, data files or a cached hub id")
        builder = _EXT_BUILDER.get(os.path.splitext(p)[1].lower())
        if builder is None:
            raise ValueError(f"{option} {p!r}: cannot tell the builder from the extension; set {option} to one of {list(BUILDERS)} and data_files")
        files = p
    elif os.path.isdir(p):
        builder, data_dir = None, None  # datasets infers the builder from the folder's files
    elif os.path.exists(p) or p.startswith((".", "/")) or p.count("/") > 1:
        raise FileNotFoundError(f"{option} {p!r} is not a save_to_disk folder, a data file, a glob or a folder; expected one of those or a hub id")
    kw: dict[str, Any] = {"streaming": streaming}
    if name is not None:
        kw["name"] = name
    if files is not None:
        kw["data_files"] = files
    if data_dir is not None:
        kw["data_dir"] = data_dir
    try:
        try:
            if builder == "audiofolder" and not torchcodec_works():
                logger.info("audiofolder read by mmte's folder scan: torchcodec is not installed or cannot load FFmpeg's libraries")
                return scan_audiofolder(data_dir, files, streaming=streaming)
            loaded = datasets.load_dataset(builder or p, **kw)
        except datasets.exceptions.DatasetGenerationError as e:
            if "torchcodec" not in repr(e.__cause__):
                raise
            raise ValueError(f"{option} {p!r}: the {builder or 'dataset'} builder encodes its audio with torchcodec, which needs FFmpeg's shared "
                             f"libraries (not loadable here); install them, or build the dataset with cast_column('audio', Audio()) over the "
                             f"files' paths and save_to_disk, which mmte reads with soundfile") from None
    except FileNotFoundError as e:
        if builder is None and not os.path.isdir(p):
            raise FileNotFoundError(f"{option} {p!r}: no such dataset in the local Hugging Face cache {_cache_folders()}; "
                                    f"download it once (datasets.load_dataset({p!r})) or give a save_to_disk folder or data files") from None
        raise FileNotFoundError(f"{option} {p!r}: {str(e).splitlines()[0]}") from None
    except (ConnectionError, OSError) as e:
        if builder is None and not os.path.isdir(p):
            raise FileNotFoundError(f"{option} {p!r}: no such dataset in the local Hugging Face cache {_cache_folders()} "
                                    f"({type(e).__name__}); download it once or give a save_to_disk folder or data files") from None
        raise
    except Exception as e:
        if type(e).__name__ in ("DatasetNotFoundError", "EmptyDatasetError", "DataFilesNotFoundError"):
            where = f"the local Hugging Face cache {_cache_folders()}" if builder is None and not os.path.isdir(p) else "there"
            raise FileNotFoundError(f"{option} {p!r}: no dataset in {where} ({str(e).splitlines()[0]})") from None
        raise
    if isinstance(loaded, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        return dict(loaded)
    return {"train": loaded}


def scan_audiofolder(data_dir: str | None = None, data_files: str | Sequence[str] | Mapping[str, Any] | None = None,
                     streaming: bool = False) -> dict[str, Any]:
    """The dataset ``datasets.load_dataset("audiofolder", ...)`` builds, without torchcodec: ``{split: Dataset}``.

    Files and splits are resolved by ``datasets``' own patterns (``train/``, ``validation/``, ``test/`` top
    folders or file-name parts; ``data_files`` relative to ``data_dir``). As the builder does by default: with a
    ``metadata.csv``/``.jsonl``/``.parquet`` its rows are the dataset, its ``file_name`` (``<col>_file_name``)
    column becoming ``audio`` (``<col>``) paths next to the metadata file; without one, a ``label`` ``ClassLabel``
    of the parent folders' names is added when the files sit at one depth in more than one folder. Audio columns
    are ``Audio(decode=False)`` holding paths, which :func:`decode_audio` reads with soundfile.

    Raises:
        FileNotFoundError: the patterns name no audio file.
        ValueError: metadata without a ``file_name`` column, one naming a path outside its folder, or mixed formats.
    """
    import datasets
    import pandas as pd
    from datasets.data_files import DataFilesDict, get_data_patterns, sanitize_patterns

    base = Path(data_dir or "").expanduser().resolve().as_posix()
    patterns = sanitize_patterns(data_files) if data_files is not None else get_data_patterns(base)
    resolved = {str(k): [str(f) for f in v] for k, v in DataFilesDict.from_patterns(patterns, base_path=base).items()}
    audio = {k: [f for f in fs if os.path.splitext(f)[1].lower() in AUDIO_EXTENSIONS] for k, fs in resolved.items()}
    meta = {k: [f for f in fs if os.path.basename(f) in _METADATA_FILES] for k, fs in resolved.items()}
    where = data_files if data_files is not None else base
    if not any(audio.values()) and not any(meta.values()):
        raise FileNotFoundError(f"audiofolder {where!r} holds no audio file; expected {'/'.join(AUDIO_EXTENSIONS)} files")
    out: dict[str, Any] = {}
    if any(meta.values()):
        kinds = {os.path.splitext(f)[1] for fs in meta.values() for f in fs}
        if len(kinds) > 1:
            raise ValueError(f"audiofolder {where!r} has metadata files of different formats {sorted(kinds)}; expected one")
        for split, files in meta.items():
            frames, audio_cols = [], set()
            for f in files:
                frame = pd.read_csv(f) if f.endswith(".csv") else pd.read_json(f, lines=True) if f.endswith(".jsonl") else pd.read_parquet(f)
                named = {c: c[: -len("_file_name")] or "audio" for c in map(str, frame.columns) if c == "file_name" or c.endswith("_file_name")}
                if not named:
                    raise ValueError(f"metadata file {f!r} has no file_name column; it has {list(frame.columns)}")
                frame = frame.rename(columns=named)
                for c in named.values():
                    frame[c] = [_inside(os.path.dirname(f), v) for v in frame[c]]
                frames.append(frame)
                audio_cols.update(named.values())
            if frames:  # a split without metadata has no rows, as in the builder
                ds = datasets.Dataset.from_pandas(pd.concat(frames, ignore_index=True), preserve_index=False)
                for c in sorted(audio_cols):
                    ds = ds.cast_column(c, datasets.Value("string")).cast_column(c, datasets.Audio(decode=False))  # pandas' large_string
                out[split] = ds
    else:
        labels = {os.path.basename(os.path.dirname(f)) for fs in audio.values() for f in fs}
        depths = {f.replace("\\", "/").count("/") for fs in audio.values() for f in fs}
        add_labels = len(labels) > 1 and len(depths) == 1
        for split, files in audio.items():
            cols: dict[str, list[Any]] = {"audio": files}
            if add_labels:
                cols["label"] = [os.path.basename(os.path.dirname(f)) for f in files]
            ds = datasets.Dataset.from_dict(cols).cast_column("audio", datasets.Audio(decode=False))
            out[split] = ds.cast_column("label", datasets.ClassLabel(names=sorted(labels))) if add_labels else ds
    if streaming:
        out = {k: v.to_iterable_dataset() for k, v in out.items()}
    return out


def _inside(folder: str, name: Any) -> str:
    """``name`` (a metadata file's ``file_name``) as a path in ``folder``; one that leaves it is refused."""
    rel = os.path.normpath(str(name)).replace("\\", "/")
    if "://" in str(name) or os.path.isabs(rel) or rel == ".." or rel.startswith("../"):
        raise ValueError(f"metadata file_name {name!r} must be a relative path inside {folder!r}")
    return os.path.join(folder, rel)


def class_names_of(feature: Any) -> list[str] | None:
    """The names of a ``ClassLabel`` feature (None for any other feature)."""
    import datasets

    return list(feature.names) if isinstance(feature, datasets.ClassLabel) else None


_TORCHCODEC: bool | None = None


def torchcodec_works() -> bool:
    """Whether ``datasets`` can decode audio here (torchcodec imports and finds FFmpeg's libraries)."""
    global _TORCHCODEC
    if _TORCHCODEC is None:
        try:
            from torchcodec.decoders import AudioDecoder  # noqa: F401  (loads FFmpeg's libraries)

            _TORCHCODEC = True
        except Exception:  # noqa: BLE001 (missing package or libraries: read bytes with soundfile instead)
            _TORCHCODEC = False
    return _TORCHCODEC


def audio_reader(choice: str = "auto") -> str:
    """``datasets`` (torchcodec, the ``Audio`` feature decodes) or ``soundfile`` (mmte reads the cell's bytes/path)."""
    if choice not in ("auto", "datasets", "soundfile"):
        raise ValueError(f"audio_decoder must be 'auto', 'datasets' or 'soundfile'; got {choice!r}")
    if choice == "auto":
        return "datasets" if torchcodec_works() else "soundfile"
    if choice == "datasets" and not torchcodec_works():
        raise ValueError("audio_decoder 'datasets' needs torchcodec with FFmpeg's shared libraries, which do not load here; use 'soundfile'")
    return choice


def decode_audio(value: Any, what: str = "audio cell") -> tuple[torch.Tensor, int]:
    """An ``Audio`` cell -> (mono float32 waveform ``[T]``, sample rate).

    Takes what ``datasets`` hands back: ``{"bytes", "path"}`` (``decode=False``: read with soundfile, as
    :func:`mmte.data.audio.load_audio` reads files), ``{"array", "sampling_rate"}``, a torchcodec decoder, or a path.
    """
    import soundfile as sf

    from .audio import check_waveform, load_audio

    if isinstance(value, (str, os.PathLike)):
        return load_audio(value)
    if hasattr(value, "get_all_samples"):  # torchcodec's AudioDecoder (datasets 4+)
        s = value.get_all_samples()
        return check_waveform(s.data.float().mean(0), what), int(s.sample_rate)
    if isinstance(value, Mapping):
        if value.get("array") is not None:
            a = np.asarray(value["array"], dtype=np.float32)
            return check_waveform(torch.from_numpy(a if a.ndim == 1 else a.mean(0)), what), int(value["sampling_rate"])
        if value.get("bytes"):
            data, sr = sf.read(io.BytesIO(value["bytes"]), dtype="float32", always_2d=True)
            return check_waveform(torch.from_numpy(np.ascontiguousarray(data.mean(1))), f"{what} {value.get('path') or ''}".strip()), int(sr)
        if value.get("path"):
            return load_audio(value["path"])
    raise ValueError(f"{what}: expected audio bytes, a path or an array; got {type(value).__name__}")
