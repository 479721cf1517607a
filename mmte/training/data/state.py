"""The data state a DataModule saves in every checkpoint (class map, table schema, scalers), read back.

A DataModule's :meth:`~mmte.training.data.MMTEDataModule.state_dict` is plain lists and dicts tagged
with :data:`STATE_FORMAT` and the DataModule's class name; Lightning stores it under that class name.
``state_from`` (set by the ``mmte`` command from ``--ckpt_path``) reads it with :func:`read_data_state`,
so evaluating or predicting on other data uses the training run's preprocessing and never refits it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["STATE_FORMAT", "checkpoint_for_state", "read_data_state"]

STATE_FORMAT = "mmte-data-state/1"


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
