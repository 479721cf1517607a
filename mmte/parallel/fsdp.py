"""Data parallelism: FSDP2 (``fully_shard``) per layer, HSDP, and DDP, composable with TP and PP.

FSDP2 shards each backbone layer as one unit (one all-gather before it, one reduce-scatter after its
backward), then the remaining top-level parts (tokenizers, heads, norms) and finally the root.
``reshard_after_forward`` trades memory for a second all-gather in backward (``True`` = ZeRO-3,
``False`` = ZeRO-2-like); ``MixedPrecisionPolicy`` sets the dtype of the gathered parameters and of
the gradient reduction. Explicit prefetching of the next layer's all-gather is the overlap knob.

With a 2-d ``(dp_replicate, dp_shard)`` mesh ``fully_shard`` is HSDP. Plain DDP (``dp_replicate`` only,
no TP) uses ``DistributedDataParallel`` with its bucket size and static-graph options.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

logger = logging.getLogger(__name__)

__all__ = ["DDPConfig", "FSDPConfig", "apply_ddp", "apply_fsdp"]

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def _dtype(x: str | torch.dtype | None) -> torch.dtype | None:
    if x is None or isinstance(x, torch.dtype):
        return x
    if x not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)} or None; got {x!r}")
    return _DTYPES[x]


@dataclass
class FSDPConfig:
    """FSDP2 options.

    Attributes:
        reshard_after_forward: free gathered parameters after forward (ZeRO-3) or keep them (ZeRO-2).
        param_dtype: dtype of the gathered parameters for compute (``"bf16"``; None = as stored).
        reduce_dtype: dtype of the gradient reduce-scatter (None = param_dtype).
        prefetch: explicitly prefetch this many following layers' all-gathers in forward/backward.
    """

    reshard_after_forward: bool = True
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    prefetch: int = 1

    def __post_init__(self):
        _dtype(self.param_dtype), _dtype(self.reduce_dtype)
        if not isinstance(self.prefetch, int) or self.prefetch < 0:
            raise ValueError(f"FSDPConfig.prefetch must be an int >= 0; got {self.prefetch!r}")


@dataclass
class DDPConfig:
    """DDP options: gradient bucket size (MiB) and static graph (fixed set of used parameters)."""

    bucket_cap_mb: float = 25.0
    static_graph: bool = False
    find_unused_parameters: bool = False

    def __post_init__(self):
        if not self.bucket_cap_mb > 0:
            raise ValueError(f"DDPConfig.bucket_cap_mb must be > 0; got {self.bucket_cap_mb!r}")


def _leaves(module: nn.Module) -> list[nn.Module]:
    """``module`` itself, or, for a container without a ``forward`` of its own (``ModuleDict``,
    ``ModuleList``), the leaves inside it: FSDP2 hooks run on ``forward``, which containers never get."""
    if isinstance(module, (nn.ModuleDict, nn.ModuleList)):
        return [leaf for child in module.children() if child is not None for leaf in _leaves(child)]
    return [module]


def _units(model: nn.Module) -> list[nn.Module]:
    """Sharding units in execution order: each backbone layer (and its norms), then every other
    top-level part with parameters, with containers opened up (each tokenizer, each head). Whatever is
    left (e.g. a modality embedding, parameters owned by the root) goes with the root unit."""
    from .tp import find_backbones

    units: list[nn.Module] = []
    covered: set[int] = set()
    for _, bb in find_backbones(model):
        for name in ("norm_pre",):
            m = getattr(bb, name, None)
            if m is not None and any(True for _ in m.parameters()):
                units.append(m)
        units.extend(bb.layers.values())
        m = getattr(bb, "norm", None)
        if m is not None and any(True for _ in m.parameters()):
            units.append(m)
        covered.add(id(bb))
    for _, child in model.named_children():
        if child is None or id(child) in covered or not any(True for _ in child.parameters()):
            continue
        if any(id(m) in covered for m in child.modules()):
            continue  # a wrapper holding the backbone: its leftovers go with the root
        for leaf in _leaves(child):
            if any(True for _ in leaf.parameters()) and _called_as_module(leaf):
                units.append(leaf)
    return units


def _called_as_module(module: nn.Module) -> bool:
    """Whether FSDP2 may shard ``module`` as a unit: it has a ``forward`` and callers use it through
    ``__call__`` (mmte marks modules read by attribute, e.g. ``ModalityEmbedding``, with
    ``fsdp_unit = False``)."""
    return getattr(module, "fsdp_unit", True) and type(module).forward is not nn.Module.forward


def apply_fsdp(parts: Sequence[nn.Module] | nn.Module, dp_mesh, config: FSDPConfig | None = None):
    """``fully_shard`` each layer and top-level part of every model part, then each part's root.

    Args:
        parts: a model, or a pipeline rank's stage modules (views sharing leaves with the rank's local
            model; each stage's root becomes its own FSDP root, which is what ``PipelineStage`` expects).
        dp_mesh: 1-d ``dp_shard`` mesh (FSDP) or 2-d ``(dp_replicate, dp_shard)`` mesh (HSDP).
        config: :class:`FSDPConfig`.

    Returns:
        the list of parts (sharded in place).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    cfg = config or FSDPConfig()
    mp = MixedPrecisionPolicy(param_dtype=_dtype(cfg.param_dtype), reduce_dtype=_dtype(cfg.reduce_dtype))
    parts = [parts] if isinstance(parts, nn.Module) else list(parts)
    done: set[int] = set()
    n = 0
    for part in parts:
        units = [u for u in _units(part) if id(u) not in done]
        for i, u in enumerate(units):
            # the last unit's backward runs right after its forward: resharding it buys nothing
            last = i == len(units) - 1
            fully_shard(u, mesh=dp_mesh, reshard_after_forward=cfg.reshard_after_forward and not last, mp_policy=mp)
            done.add(id(u))
            n += 1
        if cfg.prefetch > 0:
            for i, u in enumerate(units):
                nxt = units[i + 1 : i + 1 + cfg.prefetch]
                prv = units[max(i - cfg.prefetch, 0) : i][::-1]
                if nxt:
                    u.set_modules_to_forward_prefetch(nxt)
                if prv:
                    u.set_modules_to_backward_prefetch(prv)
        fully_shard(part, mesh=dp_mesh, reshard_after_forward=cfg.reshard_after_forward, mp_policy=mp)
        done.add(id(part))
        n += 1
    logger.info(
        "FSDP2 over %s (size %d): sharded %d units in %d part(s), reshard_after_forward=%s, param_dtype=%s, "
        "reduce_dtype=%s, prefetch=%d",
        dp_mesh.mesh_dim_names,
        dp_mesh.size(),
        n,
        len(parts),
        cfg.reshard_after_forward,
        cfg.param_dtype,
        cfg.reduce_dtype,
        cfg.prefetch,
    )
    return parts


def apply_ddp(module: nn.Module, dp_mesh, config: DDPConfig | None = None, device: torch.device | None = None) -> nn.Module:
    """Replicate ``module`` over the 1-d ``dp_replicate`` mesh with torch's composable ``replicate``
    (DDP's reducer installed as hooks, in place): the module keeps its class, attributes and FQNs, so
    code reading ``model.backbone`` and checkpoints written without DP work unchanged."""
    from torch.distributed._composable.replicate import replicate

    cfg = config or DDPConfig()
    if any(hasattr(p, "_spec") for p in module.parameters()):
        raise ValueError("DDP cannot replicate DTensor (tensor-parallel) parameters; use FSDP2/HSDP with tp > 1")
    kwargs = {"bucket_cap_mb": cfg.bucket_cap_mb, "static_graph": cfg.static_graph, "find_unused_parameters": cfg.find_unused_parameters}
    if device is not None and torch.device(device).type not in ("cpu", "meta"):
        kwargs["device_id"] = torch.device(device)
    replicate(module, device_mesh=dp_mesh, **kwargs)
    logger.info("DDP (composable replicate, FQNs kept) over %d replicas: bucket_cap_mb=%s, static_graph=%s", dp_mesh.size(), cfg.bucket_cap_mb, cfg.static_graph)
    return module
