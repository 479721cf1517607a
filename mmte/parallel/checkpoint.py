"""Distributed checkpoints with ``torch.distributed.checkpoint`` (DCP) that load under another layout.

Every rank writes only its shards; the files record each tensor's global shape and FQN. Because
tensor-parallel DTensors, FSDP2 shards and pipeline stages all keep the original FQNs (stages are
pruned views of the model), a checkpoint written at TP=2 / PP=2 / FSDP=4 loads into TP=1, no PP, one
process — DCP reads whatever slices the new layout needs. Optimizer state is stored flattened
(``state.<fqn>.<key>``) so pipeline ranks' optimisers merge without collisions.

:func:`export_safetensors` consolidates a DCP folder into one ``.safetensors`` file of full tensors
(for sharing / conversion), offline and without a process group.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

__all__ = ["export_safetensors", "load", "save", "state_dict"]


def _as_list(x):
    if x is None:
        return []
    return [x] if not isinstance(x, (list, tuple)) else list(x)


def state_dict(parts: nn.Module | Sequence[nn.Module], optimizers=None) -> dict[str, Any]:
    """``{"model": {fqn: tensor}, "optim": {...}}`` of a (possibly sharded / pipelined) model.

    Args:
        parts: the model, or this rank's model parts.
        optimizers: one optimizer per part (or None).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    parts, opts = _as_list(parts), _as_list(optimizers)
    if opts and len(opts) != len(parts):
        raise ValueError(f"need one optimizer per model part; got {len(opts)} optimizers for {len(parts)} parts")
    model: dict[str, Any] = {}
    for p in parts:
        model.update(get_model_state_dict(p))
    out: dict[str, Any] = {"model": model}
    if opts:
        options = StateDictOptions(flatten_optimizer_state_dict=True)
        optim: dict[str, Any] = {}
        for p, o in zip(parts, opts):
            optim.update(get_optimizer_state_dict(p, o, options=options))
        out["optim"] = optim
    return out


def save(path: str | os.PathLike, parts: nn.Module | Sequence[nn.Module], optimizers=None, *, extra: dict | None = None) -> Path:
    """Write a DCP checkpoint of the model (and optimizers) from every rank.

    Args:
        path: the checkpoint folder.
        parts: model or model parts on this rank.
        optimizers: one per part, or None.
        extra: small picklable values stored alongside (e.g. ``{"step": 10}``).
    """
    import torch.distributed.checkpoint as dcp

    sd = state_dict(parts, optimizers)
    if extra:
        sd["extra"] = dict(extra)
    path = Path(path)
    dcp.save(sd, checkpoint_id=str(path))
    logger.info("saved distributed checkpoint to %s (%d model tensors)", path, len(sd["model"]))
    return path


def load(path: str | os.PathLike, parts: nn.Module | Sequence[nn.Module], optimizers=None, *, strict: bool = True) -> dict:
    """Load a DCP checkpoint into the current layout (any TP/PP/FSDP degree, or a single process).

    Returns:
        the ``extra`` dict saved with it (empty if none).
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    parts, opts = _as_list(parts), _as_list(optimizers)
    sd = state_dict(parts, opts or None)
    extra_keys = _extra_keys(path)
    if extra_keys:
        sd["extra"] = {k: None for k in extra_keys}
    no_dist = not (dist.is_available() and dist.is_initialized())
    dcp.load(sd, checkpoint_id=str(path), no_dist=no_dist)
    for p in parts:
        keys = set(p.state_dict())
        own = {k: v for k, v in sd["model"].items() if k in keys}
        set_model_state_dict(p, own, options=StateDictOptions(strict=strict))
    if opts:
        options = StateDictOptions(flatten_optimizer_state_dict=True)
        for p, o in zip(parts, opts):
            names = {n for n, _ in p.named_parameters()}
            own = {k: v for k, v in sd["optim"].items() if _optim_key_fqn(k, names) is not None}
            set_optimizer_state_dict(p, o, own, options=options)
    logger.info("loaded distributed checkpoint %s into %d part(s)", path, len(parts))
    return sd.get("extra", {})


def _optim_key_fqn(key: str, names: set[str]) -> str | None:
    # flattened keys: "state.<fqn>.<stat>" and "param_groups.<fqn>.<option>"
    head, _, rest = key.partition(".")
    if head not in ("state", "param_groups"):
        return None
    fqn = rest.rsplit(".", 1)[0]
    return fqn if fqn in names else None


def _extra_keys(path) -> list[str]:
    from torch.distributed.checkpoint import FileSystemReader

    md = FileSystemReader(str(path)).read_metadata()
    return sorted({k.split(".", 1)[1] for k in md.state_dict_metadata if k.startswith("extra.")})


def export_safetensors(path: str | os.PathLike, out: str | os.PathLike, *, prefix: str = "model.") -> Path:
    """Consolidate a DCP checkpoint's model tensors into one safetensors file (full, unsharded tensors).

    Args:
        path: DCP folder written by :func:`save` (or Lightning's distributed checkpoint).
        out: the ``.safetensors`` file to write.
        prefix: keep the keys under this prefix (and strip it); ``""`` keeps everything tensor-valued.
    """
    import tempfile

    from safetensors.torch import save_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        tmp_file = os.path.join(tmp, "full.pt")
        dcp_to_torch_save(str(path), tmp_file)
        full = torch.load(tmp_file, weights_only=True, map_location="cpu")
    flat: dict[str, torch.Tensor] = {}

    def walk(d, pre=""):
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v, f"{pre}{k}.")
            elif isinstance(v, torch.Tensor):
                flat[f"{pre}{k}"] = v

    walk(full)
    tensors = {k[len(prefix):]: v.contiguous() for k, v in flat.items() if k.startswith(prefix)}
    if not tensors:
        raise ValueError(f"no tensors under prefix {prefix!r} in {path}; found keys like {sorted(flat)[:5]}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out))
    logger.info("exported %d tensors from %s to %s", len(tensors), path, out)
    return out
