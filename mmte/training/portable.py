"""Portable checkpoints: one format whatever the layout that wrote it.

A checkpoint written by :class:`~mmte.training.strategy.MMTEStrategy` (TP, FSDP2, DDP, PP, or any mix)
is, by default, the file a single process writes: Lightning's checkpoint dict whose ``state_dict`` holds
full (unsharded) tensors under the model's own FQNs, minus a frozen backbone that can be rebuilt from its
source. The one difference is the optimizer state, which is keyed by parameter FQN
(``"state.<fqn>.exp_avg"``, ``"param_groups.<fqn>.lr"``: torch's *flattened* optimizer state dict)
instead of by position, because a pipeline rank's optimizer only knows its own parameters. This module
converts between the two optimizer formats (:func:`optim_to_flat`, :func:`optim_from_flat`), gathers
full state onto rank 0 (:func:`gather_full`), and consolidates a distributed (DCP) checkpoint folder
into such a file (:func:`consolidate`), which is what ``mmte convert <folder> <file>`` does and what a
single-process ``--ckpt_path <folder>`` does on the fly.

So a run can move between layouts: TP=2 -> one process, DP=2 -> TP=2, PP=2 -> FSDP, one process -> PP.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

__all__ = ["FLAT", "LIVE", "consolidate", "gather_full", "is_flat", "optim_from_flat", "optim_to_flat"]

FLAT = "fqn-flat"  # checkpoint["mmte"]["optimizer_format"] of FQN-keyed optimizer states
# in a distributed (DCP) checkpoint the live weights beside averaged ones (checkpoint["current_model_state"],
# mmte.training.ema) travel as state_dict entries under this prefix, so that they are saved as shards too
LIVE = "current_model_state/"


def is_flat(state: Mapping[str, Any]) -> bool:
    """Whether an optimizer state dict is FQN-keyed (flattened) rather than torch's positional format."""
    return bool(state) and "state" not in state and all(isinstance(k, str) and k.startswith(("state.", "param_groups.")) for k in state)


def optim_to_flat(state: Mapping[str, Any], names: Sequence[Sequence[str]]) -> dict[str, Any]:
    """torch's optimizer ``state_dict()`` -> FQN-keyed flat dict.

    Args:
        state: ``{"state": {position: {...}}, "param_groups": [{"params": [positions], ...}]}``.
        names: the parameter FQNs of each group, in the optimizer's order.
    """
    groups = state["param_groups"]
    if len(groups) != len(names) or any(len(g["params"]) != len(n) for g, n in zip(groups, names)):
        raise ValueError(
            f"optimizer state has groups of sizes {[len(g['params']) for g in groups]} but the model's trainable "
            f"parameters form groups of sizes {[len(n) for n in names]}: the checkpoint was written for another model or freeze policy"
        )
    flat: dict[str, Any] = {}
    for g, gnames in zip(groups, names):
        for pid, fqn in zip(g["params"], gnames):
            for k, v in state["state"].get(pid, {}).items():
                flat[f"state.{fqn}.{k}"] = v
            for k, v in g.items():
                if k != "params":
                    flat[f"param_groups.{fqn}.{k}"] = v
    return flat


def optim_from_flat(flat: Mapping[str, Any], names: Sequence[Sequence[str]]) -> dict[str, Any]:
    """FQN-keyed flat dict -> torch's positional optimizer ``state_dict()`` for groups ``names``.

    Raises:
        ValueError: a parameter of ``names`` has no entry in ``flat``.
    """
    state: dict[int, dict[str, Any]] = {}
    groups: list[dict[str, Any]] = []
    per_fqn: dict[str, dict[str, Any]] = {}
    options: dict[str, dict[str, Any]] = {}
    for key, v in flat.items():
        kind, rest = key.split(".", 1)
        fqn, k = rest.rsplit(".", 1)
        (per_fqn if kind == "state" else options).setdefault(fqn, {})[k] = v
    pid = 0
    missing = [n for g in names for n in g if n not in options]
    if missing:
        raise ValueError(f"the checkpoint's optimizer state has no entry for {missing[:5]}: it was written for another model or freeze policy")
    for gnames in names:
        group = dict(options[gnames[0]]) if gnames else {}
        group["params"] = []
        for fqn in gnames:
            if fqn in per_fqn:
                state[pid] = dict(per_fqn[fqn])
            group["params"].append(pid)
            pid += 1
        groups.append(group)
    return {"state": state, "param_groups": groups}


def gather_full(obj: dict[str, Any] | None, contribute: bool) -> dict[str, Any]:
    """Merge dicts from every rank onto global rank 0 (``contribute=False`` ranks send nothing, e.g.
    data-parallel replicas of a rank that does). Returns the merged dict on rank 0, ``{}`` elsewhere."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return dict(obj or {})
    rank0 = dist.get_rank() == 0
    out: list[Any] = [None] * dist.get_world_size() if rank0 else None
    dist.gather_object(obj if contribute else None, out, dst=0)
    merged: dict[str, Any] = {}
    if rank0:
        for part in out:
            merged.update(part or {})
    return merged


def _flat_optimizer(nested: Mapping[str, Any]) -> dict[str, Any]:
    """torch's FQN-keyed nested optimizer state (``{"state": {fqn: {...}}, "param_groups": [{"params": [fqn]}]}``)
    -> the flat form."""
    if is_flat(nested):
        return dict(nested)
    flat: dict[str, Any] = {}
    for fqn, st in nested.get("state", {}).items():
        for k, v in st.items():
            flat[f"state.{fqn}.{k}"] = v
    for g in nested.get("param_groups", []):
        for fqn in g["params"]:
            for k, v in g.items():
                if k != "params":
                    flat[f"param_groups.{fqn}.{k}"] = v
    return flat


def consolidate(folder: str | os.PathLike, out: str | os.PathLike | None = None) -> dict[str, Any]:
    """A distributed (DCP) checkpoint folder -> the portable single-file checkpoint dict (written to ``out``
    when given): full tensors in ``state_dict``, FQN-keyed optimizer states, the metadata (loops,
    callbacks, hyper-parameters) from the folder's ``meta.pt``. Runs offline, without a process group.

    Raises:
        ValueError: ``folder`` is not a DCP checkpoint folder.
    """
    import tempfile

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    folder = Path(folder)
    if not (folder / ".metadata").is_file():
        raise ValueError(f"{folder} is not a distributed checkpoint folder (no .metadata file); expected a folder written with save_distributed_checkpoint: true")
    with tempfile.TemporaryDirectory() as tmp:
        full_file = os.path.join(tmp, "full.pt")
        dcp_to_torch_save(str(folder), full_file)
        full = torch.load(full_file, weights_only=False, map_location="cpu")
    meta_file = folder / "meta.pt"
    ckpt: dict[str, Any] = torch.load(meta_file, weights_only=False, map_location="cpu") if meta_file.is_file() else {}
    sd = full.pop("state_dict")
    live = {k[len(LIVE):]: v for k, v in sd.items() if k.startswith(LIVE)}
    ckpt["state_dict"] = {k: v for k, v in sd.items() if not k.startswith(LIVE)}
    if live:
        ckpt["current_model_state"] = live
    optim = [full[k] for k in sorted(full) if k.startswith("optimizer_")]
    if optim:
        ckpt["optimizer_states"] = [_flat_optimizer(o) for o in optim]
    ckpt.setdefault("mmte", {})["optimizer_format"] = FLAT
    if out is not None:
        import io

        from .callbacks import atomic_write

        buf = io.BytesIO()
        torch.save(ckpt, buf)
        atomic_write(out, buf.getvalue())
        logger.info("consolidated %s into %s (%d tensors)", folder, out, len(ckpt["state_dict"]))
    return ckpt
