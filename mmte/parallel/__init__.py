"""Parallelism applied to a built model: one device mesh, TP/SP plans, pipeline stages and schedules,
FSDP2/DDP, distributed checkpoints. See :func:`parallelize` for the order they are applied in."""

from .apply import ParallelConfig, Parallelized, apply_activation_checkpointing, apply_compile, parallelize
from .checkpoint import export_safetensors, load, save
from .fsdp import DDPConfig, FSDPConfig, apply_ddp, apply_fsdp
from .mesh import MESH_DIMS, ParallelDims, amax_group, build_mesh, dp_mesh
from .pipeline import SCHEDULES, bubble_fraction, build_schedule, pipeline_split, stage_fqns
from .tp import apply_tp, tp_plan

__all__ = [
    "MESH_DIMS",
    "SCHEDULES",
    "DDPConfig",
    "FSDPConfig",
    "ParallelConfig",
    "ParallelDims",
    "Parallelized",
    "amax_group",
    "apply_activation_checkpointing",
    "apply_compile",
    "apply_ddp",
    "apply_fsdp",
    "apply_tp",
    "bubble_fraction",
    "build_mesh",
    "build_schedule",
    "dp_mesh",
    "export_safetensors",
    "load",
    "parallelize",
    "pipeline_split",
    "save",
    "stage_fqns",
    "tp_plan",
]
