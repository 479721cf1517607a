"""Carry structured values across a pipeline-stage boundary.

``torch.distributed.pipelining`` sends tuples of tensors between stages, infers their shapes once (with
*uninitialised* tensors on every stage but the first), and splits one ``target`` tensor into
microbatches for the last stage's loss. A model's stage output is richer: hidden states, a padding mask,
a head's side information (``num_prefix_tokens``, a patch grid, instance-norm statistics), and a batch
may hold several targets. So:

* :func:`structure` describes a pytree (dicts, lists, tuples; tensor and JSON-able leaves) as a JSON
  string: the tree's shape, its non-tensor leaves and its tensors' dtypes. It is computed where the
  value is made and shared out of band (the strategy broadcasts it once per batch shape), never sent
  inside the tensors, so a stage can rebuild the tree even from uninitialised shape-inference tensors.
* :func:`pack` / :func:`unpack`: the tree's tensors, in pytree order. A tensor that requires grad
  travels as is (its gradient flows back); any other travels as a same-size integer view
  (``float32 -> int32``, ``bool -> uint8``), so the receiving stage does not treat it as a
  differentiable input. Bit-exact either way.
* :func:`pack_rows` / :func:`unpack_rows`: per-sample tensors (targets, ids) as one ``uint8 [B, bytes]``
  tensor, which the schedule splits into microbatches like any target.

Nothing here depends on the model.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten, treespec_dumps, treespec_loads

__all__ = ["pack", "pack_rows", "structure", "unpack", "unpack_rows"]

_VIEW = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
_DTYPES = {str(d): d for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.bool, torch.int64, torch.int32,
                                torch.int16, torch.int8, torch.uint8)}


def structure(tree: Any, per_sample: bool = False) -> str:
    """A JSON description of ``tree``: its pytree spec, non-tensor leaves and tensor dtypes (and, with
    ``per_sample``, each tensor's shape after the batch dimension).

    Raises:
        ValueError: a leaf is neither a tensor nor JSON-serialisable.
    """
    leaves, spec = tree_flatten(tree)
    static = [None if isinstance(x, torch.Tensor) else x for x in leaves]
    where = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    tensors = [leaves[i] for i in where]
    info: dict[str, Any] = {"spec": treespec_dumps(spec), "static": static, "tensors": where, "dtypes": [str(t.dtype) for t in tensors]}
    if per_sample:
        info["shapes"] = [list(t.shape[1:]) for t in tensors]
    try:
        return json.dumps(info)
    except TypeError as e:
        raise ValueError(f"a pipeline stage can only pass tensors and plain values (int, float, str, lists, dicts); {e}") from None


def _leaves(tree: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(tree)
    return [x for x in leaves if isinstance(x, torch.Tensor)]


def _as_sendable(t: torch.Tensor) -> torch.Tensor:
    if t.requires_grad:
        return t
    return t.to(torch.uint8) if t.dtype == torch.bool else t.contiguous().view(_VIEW[t.element_size()])


def _as_original(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if t.dtype == dtype:
        return t
    return t.to(torch.bool) if dtype == torch.bool else t.view(dtype)


def pack(tree: Any) -> tuple[torch.Tensor, ...]:
    """The tensors of ``tree`` to send to the next stage (see the module docstring)."""
    return tuple(_as_sendable(t) for t in _leaves(tree))


def unpack(tensors: tuple[torch.Tensor, ...] | list[torch.Tensor], struct: str) -> Any:
    """Rebuild the tree described by ``struct`` (from :func:`structure`) from received ``tensors``."""
    info = json.loads(struct)
    dtypes = [_DTYPES[d] for d in info["dtypes"]]
    if len(tensors) != len(dtypes):
        raise ValueError(f"pipeline boundary: expected {len(dtypes)} tensors, got {len(tensors)}")
    return _rebuild(info, [_as_original(t, d) for t, d in zip(tensors, dtypes)])


def _rebuild(info: dict[str, Any], tensors: list[torch.Tensor]) -> Any:
    leaves = list(info["static"])
    for i, t in zip(info["tensors"], tensors):
        leaves[i] = t
    return tree_unflatten(leaves, treespec_loads(info["spec"]))


def pack_rows(tree: Any) -> tuple[torch.Tensor, str]:
    """Per-sample tensors (each ``[B, ...]``) as one ``uint8 [B, bytes]`` tensor, and their structure."""
    tensors = _leaves(tree)
    if not tensors:
        raise ValueError("pack_rows needs at least one tensor")
    b = tensors[0].shape[0]
    bad = [tuple(t.shape) for t in tensors if t.dim() == 0 or t.shape[0] != b]
    if bad:
        raise ValueError(f"per-sample tensors must share the batch dimension {b}; got shapes {bad}")
    rows = [(t.to(torch.uint8) if t.dtype == torch.bool else t).detach().contiguous().reshape(b, -1).view(torch.uint8) for t in tensors]
    return torch.cat(rows, 1), structure(tree, per_sample=True)


def unpack_rows(rows: torch.Tensor, struct: str) -> Any:
    """Inverse of :func:`pack_rows` (for any number of rows, e.g. one microbatch)."""
    info = json.loads(struct)
    b, out, start = rows.shape[0], [], 0
    for d, shape in zip(info["dtypes"], info["shapes"]):
        dtype = _DTYPES[d]
        stored = torch.uint8 if dtype == torch.bool else dtype
        n = stored.itemsize
        for s in shape:
            n *= s
        t = rows[:, start : start + n].contiguous().view(stored).reshape(b, *shape)
        out.append(t.to(torch.bool) if dtype == torch.bool else t)
        start += n
    return _rebuild(info, out)
