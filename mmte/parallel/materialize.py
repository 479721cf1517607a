"""Materialise a model built on the meta device, with the same values under every layout.

A model built on the meta device (``MetaTransformer(..., device="meta")``) owns no memory; after
:func:`mmte.parallel.parallelize` its parameters may be DTensor shards (TP, FSDP2) of which a rank
holds only a slice. :func:`materialize` allocates the local storage (``to_empty``) and initialises
every module that owns parameters by calling its ``reset_parameters()`` under a generator seeded from
``(seed, module FQN)``. Two properties follow:

* **Layout independence.** A DTensor parameter is initialised as the *full* tensor (one module at a
  time, so the transient memory is one module's parameters) and the rank keeps its slice. On the CPU
  DTensor's random ops are not offset-aware (every shard would draw the same numbers), so this is what
  makes a TP=2 or FSDP run start from exactly the weights of a single process.
* **Order independence.** Each module's values depend only on the seed and its FQN, not on how many
  random numbers were drawn before it, so pruned pipeline stages and single-device runs agree.

Modules are visited parents first; a parent whose ``reset_parameters`` also re-initialises children is
followed by the children's own (seeded) reset.
"""

from __future__ import annotations

import logging
import zlib

import torch
from torch import nn

logger = logging.getLogger(__name__)

__all__ = ["copy_full", "materialize", "module_seed"]


def module_seed(seed: int, fqn: str) -> int:
    """The generator seed of the module at ``fqn`` (stable across processes and Python runs)."""
    return (int(seed) * 1_000_003 + zlib.crc32(fqn.encode())) % (2**63 - 1)


def _is_dtensor(t) -> bool:
    return type(t).__name__ == "DTensor" and hasattr(t, "device_mesh")


def copy_full(dst: torch.Tensor, full: torch.Tensor) -> None:
    """Copy a full (unsharded) tensor into ``dst``: a plain tensor, or a DTensor of which this rank keeps
    its slice (no communication: every rank holds ``full``)."""
    with torch.no_grad():
        if _is_dtensor(dst):
            from torch.distributed.tensor import distribute_tensor

            local = distribute_tensor(full.to(dst.dtype), dst.device_mesh, dst.placements, src_data_rank=None).to_local()
            dst.to_local().copy_(local)
        else:
            dst.copy_(full)


def _reset_module(module: nn.Module, name: str) -> None:
    own = {k: p for k, p in module._parameters.items() if p is not None}
    dt = {k: p for k, p in own.items() if _is_dtensor(p)}
    if not dt:
        module.reset_parameters()
        return
    full = {k: nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=p.to_local().device), requires_grad=p.requires_grad) for k, p in dt.items()}
    try:
        module._parameters.update(full)
        module.reset_parameters()
        values = {k: module._parameters[k].detach() for k in dt}
    finally:
        module._parameters.update(dt)
    for k, p in dt.items():
        copy_full(p, values[k])


def materialize(model: nn.Module, device: torch.device | str, *, seed: int | None = None) -> nn.Module:
    """Allocate ``model``'s (local) storage on ``device`` and initialise it reproducibly.

    Args:
        model: a model whose parameters are on the meta device (plain or DTensor); every module owning
            parameters must implement ``reset_parameters()``.
        device: where the storage goes.
        seed: base seed; default ``torch.initial_seed()`` (what ``seed_everything`` set).

    Returns:
        ``model``, materialised in place.

    Raises:
        TypeError: a module owns parameters but has no ``reset_parameters()``.
    """
    base = torch.initial_seed() if seed is None else int(seed)
    model.to_empty(device=device)
    n = 0
    for name, m in model.named_modules():
        if not any(p is not None for p in m._parameters.values()):
            continue
        if not hasattr(m, "reset_parameters"):
            raise TypeError(f"{type(m).__name__} at {name or '<root>'!r} owns parameters but has no reset_parameters()")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(module_seed(base, name))
            _reset_module(m, name)
        n += 1
    logger.info("materialised %d modules on %s (seed %d, per-module generators)", n, torch.device(device), base)
    return model
