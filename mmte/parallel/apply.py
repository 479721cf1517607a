"""``parallelize(model, mesh, config)``: every parallelism applied to a built model, in torchtitan's order.

1. FP8 conversion hook (swap GEMMs before anything shards them)
2. pipeline split (this rank keeps its stages)
3. tensor / sequence parallel (DTensor plans on each backbone)
4. activation checkpointing (per layer)
5. ``torch.compile`` (per layer, regional)
6. data parallel: FSDP2 / HSDP, or DDP

Each step logs one ``logger.info`` line. The model stays single-device code throughout.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .fsdp import DDPConfig, FSDPConfig, apply_ddp, apply_fsdp
from .mesh import ParallelDims
from .pipeline import build_schedule, pipeline_split, stage_owners, stages_per_rank
from .tp import apply_tp, find_backbones

logger = logging.getLogger(__name__)

__all__ = ["ParallelConfig", "Parallelized", "apply_activation_checkpointing", "apply_compile", "parallelize"]


@dataclass
class ParallelConfig:
    """How to parallelise a model (sizes live on the mesh; these are the choices).

    Attributes:
        sequence_parallel: split norms/dropouts along the sequence when ``tp > 1``.
        pp_schedule: pipeline schedule name (see :data:`mmte.parallel.pipeline.SCHEDULES`).
        microbatches: pipeline microbatches per step.
        virtual_stages: stages per rank for interleaved/looped schedules.
        pp_balance: ``"compute"`` (trainable vs frozen layers), ``"layers"``, ``"params"`` or per-layer weights.
        pp_first, pp_last: top-level children placed on the first / last stage (default: by name).
        activation_checkpointing: ``"none"`` or ``"full"`` (recompute each layer in backward).
        compile: ``torch.compile`` each backbone layer.
        fsdp: :class:`FSDPConfig` (used when ``dp_shard > 1``, or HSDP with ``dp_replicate > 1``).
        ddp: :class:`DDPConfig` (used when only ``dp_replicate > 1`` and no TP).
        async_tp: overlap TP collectives with GEMMs (CUDA + compile only).
    """

    sequence_parallel: bool = False
    pp_schedule: str = "1f1b"
    microbatches: int = 4
    virtual_stages: int = 2
    pp_balance: str | list[float] = "compute"
    pp_first: list[str] | None = None
    pp_last: list[str] | None = None
    activation_checkpointing: str = "none"
    compile: bool = False
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    async_tp: bool = False

    def __post_init__(self):
        if self.activation_checkpointing not in ("none", "full"):
            raise ValueError(f"activation_checkpointing must be 'none' or 'full'; got {self.activation_checkpointing!r}")
        if isinstance(self.fsdp, dict):
            self.fsdp = FSDPConfig(**self.fsdp)
        if isinstance(self.ddp, dict):
            self.ddp = DDPConfig(**self.ddp)
        stages_per_rank(self.pp_schedule, self.virtual_stages)  # validates the name
        if not isinstance(self.microbatches, int) or self.microbatches < 1:
            raise ValueError(f"microbatches must be a positive int; got {self.microbatches!r}")


@dataclass
class Parallelized:
    """What :func:`parallelize` returns.

    Attributes:
        model: this rank's model (the whole model without PP; the rank's pruned share with PP). Give
            its parameters to the optimizer and it to checkpoints; FQNs are the original ones.
        parts: modules that run forward (``[model]`` without PP; the stage views with PP).
        schedule: the pipeline schedule (None without PP): ``schedule.step(x, target=y, losses=[])``.
        stages: ``PipelineStage`` objects (empty without PP).
        mesh, dims: the device mesh and the resolved sizes.
        make_schedule: builds a fresh ``(schedule, stages)`` over the same stage modules (PP only). A
            schedule fixes its tensor shapes at its first step, so a batch of another shape (an epoch's
            last, smaller batch; evaluation) needs its own; see :meth:`schedule_for`.
    """

    model: nn.Module
    parts: list[nn.Module]
    schedule: Any = None
    stages: list = field(default_factory=list)
    mesh: Any = None
    dims: ParallelDims | None = None
    make_schedule: Callable[[], tuple[Any, list]] | None = None
    stage_modules: list = field(default_factory=list)
    owners: dict = field(default_factory=dict)
    _by_shape: dict = field(default_factory=dict, repr=False)

    def schedule_for(self, key: Any, microbatches: int | None = None) -> Any:
        """The schedule for batches whose shapes are ``key``, split into ``microbatches`` (default: the
        configured number); built on first use, the first one being :attr:`schedule`."""
        if self.make_schedule is None:
            return self.schedule
        key = (key, microbatches)
        if key not in self._by_shape:
            default = microbatches is None or microbatches == self.schedule._n_microbatches
            if not self._by_shape and default:
                self._by_shape[key] = (self.schedule, self.stages)
            else:
                self._by_shape[key] = self.make_schedule(**({} if microbatches is None else {"microbatches": microbatches}))
                logger.info("pipeline: schedule for batch shapes %s, %s microbatches (%d cached)", key[0], microbatches, len(self._by_shape))
        return self._by_shape[key][0]

    @property
    def has_first_stage(self) -> bool:
        return self.schedule is None or any(s.is_first for s in self.stages)

    @property
    def has_last_stage(self) -> bool:
        return self.schedule is None or any(s.is_last for s in self.stages)


def _layers(parts: Sequence[nn.Module]) -> list[nn.Module]:
    seen, out = set(), []
    for p in parts:
        for _, bb in find_backbones(p):
            for layer in bb.layers.values():
                if id(layer) not in seen:
                    seen.add(id(layer))
                    out.append(layer)
    return out


def apply_activation_checkpointing(parts: Sequence[nn.Module]) -> int:
    """Recompute every backbone layer in backward (non-reentrant ``torch.utils.checkpoint``); FQNs unchanged.

    Not torch's composable ``torch.distributed._composable.checkpoint``: on a layer that FSDP2 also
    shards (with TP) its recompute desynchronises the ranks' collectives (gloo: "Received data size
    doesn't match expected size", in ``tests/parallel/test_parallel.py``'s dp2_tp2 run); nor
    ``checkpoint_wrapper``, which renames the layers' FQNs.
    """
    from torch.utils.checkpoint import checkpoint

    n = 0
    for layer in _layers(parts):
        if getattr(layer, "_mmte_ac", False):
            continue
        inner = layer.forward

        def fwd(*args, _inner=inner, **kwargs):
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        layer.forward = fwd
        layer._mmte_ac = True
        n += 1
    logger.info("activation checkpointing: wrapped %d backbone layers (full recompute)", n)
    return n


def apply_compile(parts: Sequence[nn.Module], **kwargs) -> int:
    """``torch.compile`` each backbone layer in place (regional compilation; FQNs unchanged)."""
    layers = _layers(parts)
    for layer in layers:
        layer.compile(**kwargs)
    logger.info("compiled %d backbone layers with torch.compile", len(layers))
    return len(layers)


def _keep_frozen(model: nn.Module, frozen: set[str]) -> None:
    """Re-apply the freeze policy after the passes that re-create parameters (TP/SP ``distribute_module``
    wraps every parameter in a new ``nn.Parameter``, trainable by default)."""
    flipped = [n for n, p in model.named_parameters() if n in frozen and p.requires_grad]
    for n, p in model.named_parameters():
        if n in frozen:
            p.requires_grad_(False)
    if flipped:
        logger.info("kept %d frozen parameter tensors frozen after parallelisation (e.g. %s)", len(flipped), flipped[0])


def parallelize(
    model: nn.Module,
    mesh,
    config: ParallelConfig | None = None,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    fp8_convert: Callable[[nn.Module], nn.Module | None] | None = None,
) -> Parallelized:
    """Apply FP8 -> PP -> TP -> AC -> compile -> FSDP2/DDP to ``model`` for this rank.

    Args:
        model: the built model (materialised, or on the meta device for FSDP2 to materialise later).
        mesh: from :func:`mmte.parallel.build_mesh` (dims ``pp, dp_replicate, dp_shard, tp``).
        config: :class:`ParallelConfig`.
        loss_fn: ``loss_fn(output, target)`` for the pipeline's last stage (required when ``pp > 1``).
        fp8_convert: optional hook converting GEMMs to FP8 (e.g. ``mmte.fp8.convert``); runs first.

    Returns:
        a :class:`Parallelized`.
    """
    cfg = config or ParallelConfig()
    sizes = {d: mesh[d].size() for d in ("pp", "dp_replicate", "dp_shard", "tp")}
    dims = ParallelDims(**sizes)
    backbones = find_backbones(model)
    if backbones:
        c = backbones[0][1].config
        dims.validate(
            mesh.size(),
            num_attention_heads=c.num_attention_heads,
            ffn_hidden_size=c.ffn_hidden_size,
            num_layers=len(backbones[0][1].layers),
            stages_per_rank=stages_per_rank(cfg.pp_schedule, cfg.virtual_stages) if dims.pp > 1 else 1,
        )
    if cfg.async_tp and mesh.device_type != "cuda":
        raise ValueError(f"async_tp needs CUDA (symmetric memory); the mesh is on {mesh.device_type!r}")

    if dims.pp > 1 and dims.dp_replicate > 1 and dims.dp_shard == 1:
        raise ValueError(
            f"pp={dims.pp} with plain DDP (dp_replicate={dims.dp_replicate}, dp_shard=1) is not supported: DDP's reducer "
            "cannot follow a pipeline schedule's split backward; use dp_shard (FSDP2) for the data-parallel dimension"
        )
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}

    # 1. FP8
    if fp8_convert is not None:
        out = fp8_convert(model)
        model = out if isinstance(out, nn.Module) else model
        logger.info("fp8 conversion hook %s applied", getattr(fp8_convert, "__qualname__", fp8_convert))

    # 2. PP
    schedule, stages = None, []
    if dims.pp > 1:
        if loss_fn is None:
            raise ValueError("pp > 1 needs a loss_fn(output, target) for the last pipeline stage")
        local, views, num_stages = pipeline_split(
            model,
            mesh["pp"].get_local_rank(),
            dims.pp,
            schedule=cfg.pp_schedule,
            virtual_stages=cfg.virtual_stages,
            balance=cfg.pp_balance,
            first=cfg.pp_first,
            last=cfg.pp_last,
        )
        parts = [m for _, m in views]
    else:
        local, views, parts = model, [], [model]

    # 3. TP
    if dims.tp > 1:
        for p in parts:
            apply_tp(p, mesh["tp"], sequence_parallel=cfg.sequence_parallel)
        if cfg.async_tp:
            from torch.distributed._symmetric_memory import enable_symm_mem_for_group

            torch._inductor.config._micro_pipeline_tp = True
            enable_symm_mem_for_group(mesh["tp"].get_group().group_name)
            logger.info("async tensor parallel enabled on the tp group")

    _keep_frozen(local, frozen)

    # 4. AC, 5. compile
    if cfg.activation_checkpointing == "full":
        apply_activation_checkpointing(parts)
    if cfg.compile:
        apply_compile(parts)

    # 6. DP
    if dims.dp_shard > 1 or (dims.dp_replicate > 1 and dims.tp > 1):
        dp_mesh = mesh["dp_replicate", "dp_shard"] if dims.dp_replicate > 1 else mesh["dp_shard"]
        apply_fsdp(parts, dp_mesh, cfg.fsdp)
    elif dims.dp_replicate > 1:
        device = None if mesh.device_type == "cpu" else torch.device(mesh.device_type, torch.accelerator.current_device_index())
        parts = [apply_ddp(p, mesh["dp_replicate"], cfg.ddp, device) for p in parts]
    if dims.dp_shard > 1 or dims.tp > 1 or dims.pp > 1:
        # sharded parameters cannot be touched outside their unit's forward; unused ones are simply
        # left without gradient (FSDP2/TP do not need DDP's every-parameter-used rule)
        for m in [local, *parts]:
            if hasattr(m, "touch_unused"):
                m.touch_unused = False
    _keep_frozen(local, frozen)

    if dims.pp > 1:
        device = torch.device(mesh.device_type) if mesh.device_type == "cpu" else torch.device(
            mesh.device_type, torch.accelerator.current_device_index()
        )
        make = functools.partial(
            build_schedule,
            [(i, p) for (i, _), p in zip(views, parts)],
            num_stages,
            mesh["pp"].get_group(),
            schedule=cfg.pp_schedule,
            microbatches=cfg.microbatches,
            loss_fn=loss_fn,
            device=device,
        )
        schedule, stages = make()
        return Parallelized(
            model=local, parts=parts, schedule=schedule, stages=stages, mesh=mesh, dims=dims, make_schedule=make,
            stage_modules=[(i, p) for (i, _), p in zip(views, parts)],
            owners=stage_owners(cfg.pp_schedule, dims.pp, cfg.virtual_stages),
        )
    return Parallelized(model=local, parts=parts, schedule=schedule, stages=stages, mesh=mesh, dims=dims)
