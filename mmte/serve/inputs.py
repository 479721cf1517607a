"""Requests -> model samples: each field of a ``POST /predict`` through the same preprocessing ``mmte predict`` uses.

A served recipe's data module decides what a request carries:

* files (:class:`~mmte.training.data.FolderDataModule`): a multipart upload with one field per modality,
  named after it (``audio``: a WAV, ``image``: a PNG/JPEG, ``time_series``: a CSV...). The upload is
  written to a temporary file and read by the data module's own preprocessing function (the one its
  predict split applies to every file, with the checkpoint's saved state: fbank statistics, frontend,
  ``min_frames``), then collated with its evaluation collate (centre crop of long clips, padding);
* arrays (:class:`~mmte.training.data.ArrayDataModule`): JSON ``{"<modality>": <nested list>}`` of the
  shape one item of the dataset has (the quickstart: an 8x8 digit with values in [0, 1]);
* table rows (:class:`~mmte.training.data.TableDataModule`): JSON ``{"rows": [{column: value}, ...]}``,
  encoded by the checkpoint's :class:`~mmte.data.tabular.TableSchema` (scalers, vocabularies): one item
  per row.

Every mistake is a :class:`RequestError` with an HTTP status and one line saying what was wrong, what
was expected and how to fix it; the server answers it as ``{"error": "<line>"}``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import MMTEError

__all__ = ["FILE_SUFFIXES", "InputSpec", "RequestError", "Upload", "input_spec"]

#: what a file field holds, by modality (for messages and ``/info``)
FILE_SUFFIXES = {"audio": ".wav", "image": ".png", "time_series": ".csv", "point_cloud": ".npy", "video": ".mp4", "imu": ".csv", "text": ".txt"}

#: request keys that are options, not inputs
OPTION_KEYS = ("top_k", "id")


class RequestError(MMTEError):
    """A request the server refuses: an HTTP ``status`` (4xx) and one line (what, expected, how to fix)."""

    def __init__(self, what: str, expected: str = "", fix: str = "", status: int = 400):
        self.status = int(status)
        super().__init__(what, expected, fix)

    def __reduce__(self):
        return (type(self), (self.what, self.expected, self.fix, self.status))


class Upload:
    """A file field of a multipart request, as the API process parsed it: its bytes and file name (cheap to pickle)."""

    __slots__ = ("data", "filename")

    def __init__(self, data: bytes, filename: str | None = None):
        self.data, self.filename = data, filename

    def read(self) -> bytes:
        return self.data

    def __reduce__(self):
        return (Upload, (self.data, self.filename))

    def __repr__(self) -> str:
        return f"Upload({self.filename!r}, {len(self.data)} bytes)"


def _top_k(value: Any) -> int | None:
    if value is None:
        return None
    try:
        k = int(value)
    except (TypeError, ValueError):
        k = -1
    if isinstance(value, bool) or k < 0 or (isinstance(value, float) and value != k):
        raise RequestError(f"top_k is {value!r}", "expected an integer >= 0 (0: the predicted class only)", "send e.g. top_k=3")
    return k


class InputSpec:
    """How one served data module turns request payloads into samples and samples into a batch.

    Args:
        kind: ``files``, ``arrays`` or ``rows``.
        modality: the data module's modality (the field name of files and arrays; ``tabular`` for rows).
        preprocess: raw value -> sample (a file path, a nested list, or an encoded table row).
        collate: samples -> the batch ``mmte predict`` would build from them.
        shape: an array item's shape (arrays), for checks and ``/info``.
        columns: the feature columns a row must have (rows), for checks and ``/info``.
        extra_columns: other columns a row may carry and that are ignored (label, id).
        encode_rows: rows (a pandas frame) -> samples (rows).
    """

    def __init__(self, kind: str, modality: str, preprocess: Callable[[Any], Any] | None, collate: Callable[[list[Any]], dict[str, Any]],
                 shape: tuple[int, ...] | None = None, columns: list[str] | None = None, extra_columns: tuple[str, ...] = (),
                 encode_rows: Callable[[Any], list[Any]] | None = None):
        self.kind, self.modality, self.preprocess, self.collate = kind, modality, preprocess, collate
        self.shape, self.columns, self.extra_columns, self.encode_rows = shape, columns, tuple(c for c in extra_columns if c), encode_rows

    # ------------------------------------------------------------------------------ description
    def expected(self) -> str:
        """What a request must hold, in words (used in every message)."""
        if self.kind == "files":
            return f"a multipart upload with one file field {self.modality!r} (e.g. curl -F {self.modality}=@x{FILE_SUFFIXES.get(self.modality, '')})"
        if self.kind == "arrays":
            return f"JSON {{\"{self.modality}\": <nested list of shape {list(self.shape or ())}>}}"
        return f"JSON {{\"rows\": [{{column: value, ...}}, ...]}} with the columns {self.columns}"

    def describe(self) -> dict[str, Any]:
        """The inputs for ``/info``."""
        if self.kind == "files":
            return {"kind": "files", "fields": {self.modality: f"a {FILE_SUFFIXES.get(self.modality, '')} file"}, "content_type": "multipart/form-data"}
        if self.kind == "arrays":
            return {"kind": "arrays", "fields": {self.modality: {"shape": list(self.shape or ())}}, "content_type": "application/json"}
        return {"kind": "rows", "fields": {"rows": {"columns": list(self.columns or [])}}, "content_type": "application/json"}

    # ----------------------------------------------------------------------------------- decode
    def decode(self, payload: Any) -> tuple[list[Any], list[str], int | None]:
        """A request's payload -> ``(samples, ids, top_k)``; one sample per file/array, one per table row.

        Raises:
            RequestError: a missing or unknown field, a wrong type or shape, an unreadable file, a row
                whose columns differ from the model's.
        """
        if not hasattr(payload, "keys") or not hasattr(payload, "get"):
            raise RequestError(f"the request body is a JSON {type(payload).__name__}", f"expected {self.expected()}", "send a JSON object or a multipart form")
        keys = [k for k in payload if k not in OPTION_KEYS]
        want = "rows" if self.kind == "rows" else self.modality
        unknown = [k for k in keys if k != want]
        if unknown:
            raise RequestError(f"unknown field(s) {unknown}", f"expected {self.expected()}", f"name the field {want!r}")
        if want not in keys:
            raise RequestError(f"the request has no field {want!r} (got {sorted(keys) or 'none'})", f"expected {self.expected()}", f"add the field {want!r}")
        top_k = _top_k(payload.get("top_k"))
        value = payload.get(want)
        if self.kind == "files":
            sample, name = self._file(value)
            return [sample], [str(payload.get("id") or name)], top_k
        if self.kind == "arrays":
            return [self._array(value)], [str(payload.get("id") or "0")], top_k
        return self._rows(value) + (top_k,)

    def _file(self, value: Any) -> tuple[Any, str]:
        read = getattr(value, "read", None)
        if read is None or isinstance(value, (str, bytes)):
            raise RequestError(f"field {self.modality!r} is a text value, not a file", f"expected {self.expected()}",
                               f"upload the file (curl -F {self.modality}=@<path>, with the @)")
        name = os.path.basename(getattr(value, "filename", None) or f"upload{FILE_SUFFIXES.get(self.modality, '')}")
        file = getattr(value, "file", None)
        data = file.read() if file is not None else read()
        if not data:
            raise RequestError(f"file {name!r} of field {self.modality!r} is empty", f"expected {self.expected()}", "upload the whole file")
        suffix = os.path.splitext(name)[1] or FILE_SUFFIXES.get(self.modality, "")
        folder = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        fd, path = tempfile.mkstemp(prefix="mmte-serve-", suffix=suffix, dir=folder)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            sample = self.preprocess(path)
        except RequestError:
            raise
        except Exception as e:  # noqa: BLE001 - any reader error means the upload is not a usable file
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            raise RequestError(f"file {name!r} of field {self.modality!r} cannot be read ({type(e).__name__}: {first})",
                               f"expected {self.expected()}", "upload a valid file of that kind") from None
        finally:
            os.unlink(path)
        return sample, name

    def _array(self, value: Any) -> Any:
        try:
            a = np.asarray(value, dtype=np.float32)
        except (TypeError, ValueError) as e:
            raise RequestError(f"field {self.modality!r} is not a nested list of numbers ({str(e).splitlines()[0][:120]})",
                               f"expected {self.expected()}", "send numbers only, every row of the same length") from None
        if a.dtype == object or a.ndim == 0:
            raise RequestError(f"field {self.modality!r} is a {type(value).__name__}, not a nested list", f"expected {self.expected()}", "send a nested list")
        if self.shape is not None and tuple(a.shape) != tuple(self.shape):
            raise RequestError(f"field {self.modality!r} has shape {list(a.shape)}", f"expected {self.expected()}", f"send one item of shape {list(self.shape)}")
        if not np.isfinite(a).all():
            raise RequestError(f"field {self.modality!r} holds NaN or infinite values", f"expected {self.expected()}", "send finite numbers")
        try:
            return self.preprocess(a.tolist())
        except Exception as e:  # noqa: BLE001
            raise RequestError(f"field {self.modality!r} cannot be preprocessed ({type(e).__name__}: {str(e).splitlines()[0][:160]})",
                               f"expected {self.expected()}", "check the values") from None

    def _rows(self, value: Any) -> tuple[list[Any], list[str]]:
        if not isinstance(value, list) or not value or not all(isinstance(r, Mapping) for r in value):
            raise RequestError(f"field 'rows' is a {type(value).__name__}{' (empty)' if isinstance(value, list) and not value else ''}",
                               f"expected {self.expected()}", "send a non-empty list of objects")
        need = set(self.columns or [])
        for i, r in enumerate(value):
            have = set(r)
            lacking, unseen = sorted(need - have), sorted(have - need - set(self.extra_columns))
            if lacking or unseen:
                parts = ([f"lacks {lacking}"] if lacking else []) + ([f"has unknown {unseen}"] if unseen else [])
                raise RequestError(f"row {i} {' and '.join(parts)}", f"expected the columns the model was trained with: {self.columns}",
                                   "send exactly those columns (a missing value as null)")
            for k, v in r.items():
                if v is not None and not isinstance(v, (str, int, float, bool)):
                    raise RequestError(f"row {i}, column {k!r} is a {type(v).__name__}", "expected a number, a string or null", "send one value per cell")
                if isinstance(v, float) and not math.isfinite(v):
                    raise RequestError(f"row {i}, column {k!r} is {v}", "expected a finite number or null", "send null for a missing value")
        import pandas as pd

        from ..data.tabular import FILE_COL, ROW_COL

        frame = pd.DataFrame([{c: r.get(c) for c in self.columns or []} for r in value])
        frame[FILE_COL], frame[ROW_COL] = "request", np.arange(len(frame))
        try:
            samples = self.encode_rows(frame)
        except (ValueError, TypeError) as e:
            raise RequestError(str(e).splitlines()[0][:300].replace("request row", "row"), "expected values like the training table's", "fix the cell") from None
        ids = [str(next((r[c] for c in ("id", *self.extra_columns[-1:]) if r.get(c) is not None), i)) for i, r in enumerate(value)]
        return samples, ids


def input_spec(dm: Any) -> InputSpec:
    """The :class:`InputSpec` of a served data module (file folders, in-memory arrays or tables), with its
    checkpoint state already applied.

    Raises:
        MMTEError: a data module kind (or option) that cannot take single requests.
    """
    from ..data import collate_batch
    from ..tokenizers.registry import get_modality

    kind = type(dm).__name__
    key = "tabular" if kind == "TableDataModule" else dm.modality
    collates = dict(dm.collates_for("eval"))  # the evaluation collate (audio: centre crop of long clips)
    if key not in collates:
        collates[key] = get_modality(key).collate_fn

    def collate(samples: list[Any]) -> dict[str, Any]:
        return collate_batch([{key: s} for s in samples], collates)

    if kind == "FolderDataModule":
        if getattr(dm, "group_norm", False):
            raise MMTEError("the recipe's data uses group_norm (each clip standardised by its speaker's clips)",
                            "expected per-file preprocessing for serving", "serve a model trained without group_norm")
        return InputSpec("files", dm.modality, dm.preprocess_item, collate)  # the predict split's own per-file function
    if kind == "ArrayDataModule":
        return InputSpec("arrays", dm.modality, dm.preprocess_item, collate, shape=dm.item_shape)
    if kind == "TableDataModule":
        schema = dm.schema

        def encode_rows(frame: Any) -> list[Any]:
            import torch

            num, cat = schema.encode(frame, "request")
            parts = {"numeric": torch.from_numpy(num), "categorical": torch.from_numpy(cat)}
            parts = {k: v for k, v in parts.items() if v.shape[1] > 0}
            return [{k: v[i] for k, v in parts.items()} for i in range(len(frame))]

        extra = (dm.label_column, getattr(dm, "split_column", None) or "", "id", dm.id_column or "")  # the last: the row id
        return InputSpec("rows", "tabular", None, collate, columns=[*schema.numeric, *schema.categorical], extra_columns=extra, encode_rows=encode_rows)
    raise MMTEError(f"mmte serve cannot serve a {kind}'s model yet", "expected a FolderDataModule, ArrayDataModule or TableDataModule recipe",
                    "use mmte predict for this recipe")


def parse_json(body: bytes) -> Any:
    """A JSON request body, or a :class:`RequestError` saying where it breaks."""
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RequestError(f"the request body is not valid JSON ({e})", "expected a JSON object", "check the quoting and brackets") from None
