"""Datasets on Hugging Face ``datasets``: folders of files, CSV/Parquet tables, in-memory arrays and
paired multimodal samples, with per-modality preprocessing applied lazily.

Every builder returns a :class:`datasets.Dataset` of *raw* rows (file paths, table values, arrays) and
integer labels; :func:`lazy_preprocess` attaches the modality's preprocessing (from the modality
registry) with ``Dataset.with_transform``, so decoding happens in the DataLoader workers, per item.
:func:`cached_preprocess` instead runs the preprocessing once with ``Dataset.map`` into an Arrow file
whose name is a fingerprint of the inputs and options, so a second run reuses it.

Splits live in :mod:`mmte.data.splits`. A split may also come from its own *source*: a folder, a file
or a glob (:func:`list_files`).

This module is framework-free (no Lightning); the DataModules of :mod:`mmte.training.data` wrap it.
"""

from __future__ import annotations

import csv
import fnmatch
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError, NonFiniteError

logger = logging.getLogger(__name__)

__all__ = [
    "SKLEARN_DATASETS",
    "arrays_dataset",
    "cached_preprocess",
    "check_files",
    "file_labels",
    "files_dataset",
    "lazy_preprocess",
    "list_files",
    "pair_by_label",
    "read_table",
    "sklearn_arrays",
    "sort_labels",
]

SKLEARN_DATASETS = ("digits", "iris", "wine", "breast_cancer")


# --------------------------------------------------------------------------------------- folders
def _labels_from_csv(path: str | os.PathLike, file_column: str, label_column: str) -> dict[str, str]:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"labels_csv not found: {path}")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        cols = reader.fieldnames or []
        missing = [c for c in (file_column, label_column) if c not in cols]
        if missing:
            raise ValueError(f"labels_csv {path} lacks column(s) {missing}; it has {cols}")
        return {row[file_column]: row[label_column] for row in reader}


def files_dataset(
    data_dir: str | os.PathLike,
    pattern: str = "*",
    *,
    label_regex: str | None = None,
    labels_csv: str | os.PathLike | None = None,
    file_column: str = "file",
    label_column: str = "label",
    class_names: Sequence[str] | None = None,
):
    """A dataset of the files under ``data_dir`` matching ``pattern`` (recursively), with labels.

    Labels come from the file name (``label_regex``'s first group, matched against the name relative
    to ``data_dir``) or from a CSV (``labels_csv`` with ``file_column`` holding relative paths or base
    names and ``label_column``); class ids follow ``class_names`` or the labels' sorted order (numeric
    labels sort as numbers).

    Returns:
        ``(dataset with columns path, name, label, class_names)``.

    Raises:
        FileNotFoundError: ``data_dir`` is not a folder.
        ValueError: no file matches, a file has no label, or both/neither label source are given.
    """
    import datasets

    root = Path(data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"data_dir {os.fspath(data_dir)!r} is not a folder (expected a folder of {pattern!r} files)")
    if (label_regex is None) == (labels_csv is None):
        raise ValueError(f"give exactly one of label_regex or labels_csv; got label_regex={label_regex!r}, labels_csv={labels_csv!r}")
    files = sorted(p for p in root.rglob("*") if p.is_file() and fnmatch.fnmatch(p.name, pattern))
    if not files:
        raise ValueError(f"no file in {os.fspath(root)!r} matches {pattern!r}")
    names = [p.relative_to(root).as_posix() for p in files]
    labels: list[str] = []
    if label_regex is not None:
        rx = re.compile(label_regex)
        for n in names:
            m = rx.search(n)
            if m is None or not m.groups():
                raise ValueError(f"file {n!r} does not match label_regex {label_regex!r} (expected a group capturing the label)")
            labels.append(m.group(1))
    else:
        table = _labels_from_csv(labels_csv, file_column, label_column)
        for n in names:
            lab = table.get(n, table.get(Path(n).name))
            if lab is None:
                raise ValueError(f"file {n!r} has no row in labels_csv {os.fspath(labels_csv)!r} (column {file_column!r})")
            labels.append(lab)
    classes = list(class_names) if class_names is not None else _sorted_labels(set(labels))
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted(set(labels) - set(index))
    if unknown:
        raise ValueError(f"labels {unknown[:8]} are not among class_names {classes}")
    ds = datasets.Dataset.from_dict({"path": [os.fspath(p) for p in files], "name": names, "label": [index[l] for l in labels]})
    return ds, classes


def _sorted_labels(labels: set[str]) -> list[str]:
    if all(re.fullmatch(r"-?\d+", l) for l in labels):
        return sorted(labels, key=int)
    return sorted(labels)


def sort_labels(labels: Sequence[str]) -> list[str]:
    """The distinct labels in class-id order: as integers when every label is one, else as strings."""
    return _sorted_labels(set(labels))


def list_files(source: str | os.PathLike, pattern: str = "*", option: str = "data_dir") -> tuple[list[str], list[str]]:
    """The files a *source* names, sorted: a folder (searched recursively for ``pattern``), one file, or a
    glob (``/data/test/*.wav``, ``/data/**/*.flac``; also filtered by ``pattern``).

    Args:
        source: the folder, file or glob.
        pattern: file-name glob applied to a folder's (or a glob's) files.
        option: the option's name, for the error messages (``"test"``, ``"data_dir"``...).

    Returns:
        ``(paths, names)``: names relative to the folder (or to the glob's fixed leading folder; a
        single file: its base name), as the label and split patterns see them.

    Raises:
        FileNotFoundError: the source is not a folder, a file, or a glob that matches something.
        ValueError: the folder or glob holds no file matching ``pattern``.
    """
    import glob as globlib

    s = os.fspath(source)
    if os.path.isdir(s):
        root = Path(s)
        files = sorted(p for p in root.rglob("*") if p.is_file() and fnmatch.fnmatch(p.name, pattern))
        if not files:
            raise ValueError(f"{option} {s!r} holds no file matching pattern {pattern!r}; point it at the folder of your files or change pattern")
        return [os.fspath(p) for p in files], [p.relative_to(root).as_posix() for p in files]
    if os.path.isfile(s):
        return [s], [Path(s).name]
    if globlib.has_magic(s):
        parts = Path(s).parts
        fixed = next((i for i, part in enumerate(parts) if globlib.has_magic(part)), len(parts))
        root = Path(*parts[:fixed]) if fixed else Path(".")
        files = sorted(Path(f) for f in globlib.glob(s, recursive=True) if os.path.isfile(f) and fnmatch.fnmatch(os.path.basename(f), pattern))
        if not files:
            raise ValueError(f"{option} {s!r} matches no file (with pattern {pattern!r}); expected a glob such as /data/test/*.wav")
        return [os.fspath(p) for p in files], [p.relative_to(root).as_posix() for p in files]
    raise FileNotFoundError(f"{option} {s!r} is not a folder, a file or a glob that matches files; give an existing folder, file or glob")


def file_labels(
    names: Sequence[str],
    *,
    label_regex: str | None = None,
    labels_csv: str | os.PathLike | None = None,
    file_column: str = "file",
    label_column: str = "label",
    required: bool = True,
    option: str = "data_dir",
) -> list[str | None]:
    """Each file's label: ``label_regex``'s first group on its name, or its row of ``labels_csv``
    (matched by relative path, then by base name).

    Args:
        names: the files' names (relative paths).
        required: a file without a label is an error (True) or gets None (prediction inputs).
        option: the source option, named in the error.

    Raises:
        ValueError: a file has no label (``required``), or both/neither label source are given.
    """
    if (label_regex is None) == (labels_csv is None):
        raise ValueError(f"give exactly one of label_regex or labels_csv; got label_regex={label_regex!r}, labels_csv={labels_csv!r}")
    out: list[str | None] = []
    if label_regex is not None:
        rx = re.compile(label_regex)
        for n in names:
            m = rx.search(n)
            lab = m.group(1) if m is not None and m.groups() else None
            if lab is None and required:
                raise ValueError(f"file {n!r} of {option} does not match label_regex {label_regex!r} (expected a group capturing the label)")
            out.append(lab)
        return out
    table = _labels_from_csv(labels_csv, file_column, label_column)
    for n in names:
        lab = table.get(n, table.get(Path(n).name))
        if lab is not None and lab.strip() == "":
            lab = None
        if lab is None and required:
            raise ValueError(f"file {n!r} of {option} has no label in labels_csv {os.fspath(labels_csv)!r} (columns {file_column!r}, {label_column!r})")
        out.append(lab)
    return out


def _check_one(path: str, modality: str) -> None:
    if os.path.getsize(path) == 0:
        raise ValueError("empty file")
    if modality == "audio":
        import soundfile as sf

        info = sf.info(path)
        if info.frames <= 0:
            raise ValueError("no audio frames")
        if info.subtype in ("FLOAT", "DOUBLE"):  # only float samples can be NaN/inf (PCM and decoded formats cannot)
            from .audio import load_audio

            load_audio(path)  # every sample finite (the message names the file), before any training step
    elif modality in ("image", "infrared", "xray"):
        from PIL import Image

        with Image.open(path) as im:
            im.verify()


def check_files(paths: Sequence[str], modality: str, on_corrupt: str = "error") -> list[int]:
    """Open every file's header (audio: ``soundfile.info``; images: ``PIL.Image.verify``).

    Args:
        paths: files to check.
        modality: decides how a file is opened (other modalities: non-empty check only).
        on_corrupt: ``"error"`` (raise on the first bad file) or ``"skip"`` (log a warning with the count).

    Returns:
        the indices of the readable files.

    Raises:
        ValueError: naming the first unreadable file and why, with ``on_corrupt="error"``.
    """
    if on_corrupt not in ("error", "skip"):
        raise ValueError(f"on_corrupt must be 'error' or 'skip'; got {on_corrupt!r}")
    good, bad = [], []
    for i, p in enumerate(paths):
        try:
            _check_one(p, modality)
        except Exception as e:  # noqa: BLE001 (any decoder error means the file is unusable)
            if on_corrupt == "error" and isinstance(e, NonFiniteError):
                raise NonFiniteError(e.what, e.expected, f"{e.fix}, or set on_corrupt: skip to drop such files") from None
            if on_corrupt == "error":
                raise ValueError(f"corrupt {modality} file {p!r}: {type(e).__name__}: {str(e).strip() or 'unreadable'} (set on_corrupt: skip to drop such files)") from None
            bad.append(p)
            continue
        good.append(i)
    if bad:
        logger.warning("skipped %d unreadable %s file(s) of %d (first: %s)", len(bad), modality, len(paths), bad[0])
    return good


# ----------------------------------------------------------------------------------------- tables
def read_table(path: str | os.PathLike, columns: Sequence[str], cache_dir: str | os.PathLike | None = None):
    """Load a CSV or Parquet file with ``datasets.load_dataset`` (Arrow cache reused on later runs).

    ``path`` may also be ``sklearn://<name>`` (one of :data:`SKLEARN_DATASETS` except digits) for
    scikit-learn's bundled tables, with the feature names as columns and ``target`` as the label.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: an unsupported suffix, or ``columns`` names a column the table lacks.
    """
    import datasets

    p = os.fspath(path)
    if p.startswith("sklearn://"):
        name = p[len("sklearn://") :]
        if name not in SKLEARN_DATASETS or name == "digits":
            raise ValueError(f"sklearn table must be one of {[n for n in SKLEARN_DATASETS if n != 'digits']}; got {name!r}")
        import sklearn.datasets as skd

        frame = getattr(skd, f"load_{name}")(as_frame=True).frame
        ds = datasets.Dataset.from_pandas(frame, preserve_index=False)
    else:
        if not os.path.isfile(p):
            raise FileNotFoundError(f"table file not found: {p}")
        suffix = Path(p).suffix.lower()
        kinds = {".csv": "csv", ".tsv": "csv", ".parquet": "parquet", ".pq": "parquet"}
        if suffix not in kinds:
            raise ValueError(f"table file must be .csv, .tsv or .parquet; got {p!r}")
        header = _table_columns(p, kinds[suffix])
        if kinds[suffix] == "csv" and not _has_data_rows(p):
            raise DataError(f"table {p} has a header ({', '.join(map(str, header))}) but no data rows", "expected at least one row below the header",
                            "point path at a file with data")
        missing = [c for c in columns if c not in header]
        if missing:
            raise ValueError(f"{p} lacks column(s) {missing}; it has {header}")
        kw: dict[str, Any] = {"sep": "\t"} if suffix == ".tsv" else {}
        ds = datasets.load_dataset(kinds[suffix], data_files=os.path.abspath(p), split="train", cache_dir=os.fspath(cache_dir) if cache_dir else None, **kw)
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise ValueError(f"{p} lacks column(s) {missing}; it has {ds.column_names}")
    return ds


def _has_data_rows(path: str) -> bool:
    with open(path, encoding="utf-8", errors="replace") as fh:
        fh.readline()
        return any(line.strip() for line in fh)


def _table_columns(path: str, kind: str) -> list[str]:
    if kind == "parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    with open(path, newline="") as f:
        delim = "\t" if path.lower().endswith(".tsv") else ","
        return next(csv.reader(f, delimiter=delim), [])


# ----------------------------------------------------------------------------------------- arrays
def _bundled_digits() -> tuple[np.ndarray, np.ndarray] | None:
    """scikit-learn's bundled ``digits.csv.gz`` read directly (64 pixel columns in 0..16, then the
    label), as ``load_digits`` reads it, without importing scikit-learn (a third of a second, a
    sixtieth of the quickstart); None where the file is not where scikit-learn keeps it."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():
        return None
    data = np.loadtxt(path, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8).astype(np.float32) / 16.0, data[:, -1].astype(np.int64)


def sklearn_arrays(name: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """One of scikit-learn's bundled datasets -> ``(x, y, class_names)``; digits as ``[N, 8, 8]`` in [0, 1]."""
    if name not in SKLEARN_DATASETS:
        raise ValueError(f"unknown scikit-learn dataset {name!r}; expected one of {SKLEARN_DATASETS}")
    if name == "digits" and (direct := _bundled_digits()) is not None:
        x, y = direct
        return x, y, [str(i) for i in range(10)]
    import sklearn.datasets as skd

    d = getattr(skd, f"load_{name}")()
    x = np.asarray(d.data, dtype=np.float32)
    if name == "digits":
        x = np.asarray(d.images, dtype=np.float32) / 16.0
    names = [str(n) for n in getattr(d, "target_names", sorted(set(d.target.tolist())))]
    return x, np.asarray(d.target, dtype=np.int64), names


def arrays_dataset(x: np.ndarray, y: np.ndarray | None = None, column: str = "x"):
    """In-memory arrays ``x [N, ...]`` (and labels ``y [N]``) as a dataset with columns ``column`` and ``label``."""
    import datasets
    import pyarrow as pa

    x = np.asarray(x)
    if y is not None and len(y) != len(x):
        raise ValueError(f"x and y differ in length: {len(x)} vs {len(y)}")
    cols: dict[str, Any] = {column: _fixed_shape_column(x) if x.dtype != object else pa.array([a.tolist() for a in x])}
    if y is not None:
        cols["label"] = pa.array(np.asarray(y))
    return datasets.Dataset(pa.table(cols))


def _fixed_shape_column(x: np.ndarray):
    """``x [N, d1, d2, ...]`` as one Arrow column of N nested fixed-size lists, built from the flat buffer
    (no Python list per item: 20x faster than ``Dataset.from_dict`` on the quickstart's 1,797 digits)."""
    import pyarrow as pa

    column = pa.array(np.ascontiguousarray(x).reshape(-1))
    for size in reversed(x.shape[1:]):
        column = pa.FixedSizeListArray.from_arrays(column, size)
    return column


def pair_by_label(labels_a: Sequence[int], labels_b: Sequence[int], seed: int = 0) -> list[tuple[int, int]]:
    """Pair every item of ``a`` with an item of ``b`` that has the same label (cycling through a
    seeded permutation of ``b``'s items of that label).

    Returns:
        ``[(index_in_a, index_in_b), ...]`` in ``a``'s order.

    Raises:
        ValueError: a label of ``a`` has no item in ``b``.
    """
    la, lb = np.asarray(labels_a), np.asarray(labels_b)
    rng = np.random.default_rng(seed)
    pools = {int(c): rng.permutation(np.flatnonzero(lb == c)) for c in np.unique(lb)}
    missing = sorted(set(np.unique(la).tolist()) - set(pools))
    if missing:
        raise ValueError(f"labels {missing} occur in the first modality but not in the second; cannot pair them")
    used = {c: 0 for c in pools}
    pairs = []
    for i, c in enumerate(la.tolist()):
        pool = pools[c]
        pairs.append((i, int(pool[used[c] % len(pool)])))
        used[c] += 1
    return pairs


# ---------------------------------------------------------------------------------- preprocessing
def lazy_preprocess(ds, fns: Mapping[str, tuple[str, Callable[[Any], Any]]], keep: Sequence[str] = ("label",)):
    """Attach per-column preprocessing with ``Dataset.with_transform`` (runs when an item is read).

    Args:
        ds: the dataset of raw rows.
        fns: ``{output key: (input column, fn(raw value) -> sample)}``.
        keep: columns passed through unchanged.

    Returns:
        the dataset; ``ds[i]`` is ``{output key: sample, ...kept columns}``.
    """
    fns = dict(fns)
    keep = [k for k in keep if k in ds.column_names]

    def transform(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        out = {k: [fn(v) for v in batch[col]] for k, (col, fn) in fns.items()}
        for k in keep:
            out[k] = batch[k]
        return out

    return ds.with_transform(transform)


def _fingerprint(*parts: Any) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode())
    return h.hexdigest()[:20]


def cached_preprocess(ds, fns: Mapping[str, tuple[str, Callable[[Any], Any]]], cache_dir: str | os.PathLike, key: Any, keep: Sequence[str] = ("label",)):
    """Preprocess every row once with ``Dataset.map`` into an Arrow file in ``cache_dir`` and read it
    back as torch tensors. The file name is a fingerprint of ``key`` (describe the inputs and every
    preprocessing option there) and the rows' paths/sizes/modification times when a ``path`` column
    exists, so a second run with the same inputs reuses the file and changed inputs get a new one.

    Returns:
        a dataset with the ``fns`` keys (as tensors) and ``keep`` columns.
    """
    import datasets  # noqa: F401  (Dataset.map lives there)

    stats = None
    if "path" in ds.column_names:
        stats = [(p, os.path.getsize(p), int(os.path.getmtime(p))) for p in ds["path"]]
    name = _fingerprint(key, stats, len(ds), ds.column_names)
    os.makedirs(cache_dir, exist_ok=True)
    file = os.path.join(os.fspath(cache_dir), f"mmte-{name}.arrow")
    fns = dict(fns)
    keep = [k for k in keep if k in ds.column_names]

    def fn(batch):
        out = {k: [np.asarray(f(v)) for v in batch[col]] for k, (col, f) in fns.items()}
        return out

    reused = os.path.isfile(file)
    out = ds.map(fn, batched=True, batch_size=64, cache_file_name=file, load_from_cache_file=True,
                 remove_columns=[c for c in ds.column_names if c not in keep], desc="mmte preprocess")
    logger.info("%s preprocessed Arrow cache %s (%d rows)", "reused" if reused else "wrote", file, len(out))
    return out.with_format("torch", columns=list(fns) + keep)
