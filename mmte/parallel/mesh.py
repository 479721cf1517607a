"""One device mesh for the whole job, with named dimensions ``pp``, ``dp_replicate``, ``dp_shard``, ``tp``.

The sizes are validated *before* any process-group work: a product that differs from the world size,
a tensor-parallel degree that does not divide the head count (or the MLP width), or more pipeline
stages than layers raise ``ValueError`` naming the numbers, so a bad YAML fails in milliseconds rather
than in a hung collective.

Mesh layout (outermost first): ``("pp", "dp_replicate", "dp_shard", "tp")``, as torchtitan does — TP
innermost so its frequent collectives stay on the closest devices. Every dimension is present (size 1
when unused), so ``mesh["tp"]`` always exists; the flattened ``"dp"`` dimension (``dp_replicate x
dp_shard``) is what data loaders and loss averaging use.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)

__all__ = ["MESH_DIMS", "ParallelDims", "amax_group", "build_mesh", "dp_mesh"]

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "tp")
_DP: dict[int, object] = {}  # id(root mesh) -> its flattened "dp" mesh
_DPTP: dict[int, object] = {}  # id(root mesh) -> its flattened "dp_tp" mesh


@dataclass
class ParallelDims:
    """Degrees of parallelism.

    Attributes:
        dp_replicate: data-parallel replicas (DDP, or the replicate dim of HSDP).
        dp_shard: FSDP2 shards; ``-1`` takes whatever the world size leaves over.
        tp: tensor (and sequence) parallel degree.
        pp: pipeline-parallel degree (ranks in a pipeline).
    """

    dp_replicate: int = 1
    dp_shard: int = -1
    tp: int = 1
    pp: int = 1

    def __post_init__(self):
        for name in ("dp_replicate", "tp", "pp"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"ParallelDims.{name} must be an int >= 1; got {v!r}")
        if not isinstance(self.dp_shard, int) or isinstance(self.dp_shard, bool) or (self.dp_shard < 1 and self.dp_shard != -1):
            raise ValueError(f"ParallelDims.dp_shard must be an int >= 1 or -1 (auto); got {self.dp_shard!r}")

    def resolve(self, world_size: int) -> ParallelDims:
        """A copy with ``dp_shard=-1`` filled in and the product checked against ``world_size``."""
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int; got {world_size!r}")
        dp_shard = self.dp_shard
        fixed = self.dp_replicate * self.tp * self.pp
        if dp_shard == -1:
            if world_size % fixed:
                raise ValueError(
                    f"world size {world_size} is not divisible by dp_replicate*tp*pp = "
                    f"{self.dp_replicate}*{self.tp}*{self.pp} = {fixed}, so dp_shard cannot be inferred"
                )
            dp_shard = world_size // fixed
        product = self.dp_replicate * dp_shard * self.tp * self.pp
        if product != world_size:
            raise ValueError(
                f"dp_replicate*dp_shard*tp*pp = {self.dp_replicate}*{dp_shard}*{self.tp}*{self.pp} = {product} "
                f"differs from the world size {world_size}"
            )
        return ParallelDims(self.dp_replicate, dp_shard, self.tp, self.pp)

    def validate(
        self,
        world_size: int,
        *,
        num_attention_heads: int | None = None,
        ffn_hidden_size: int | None = None,
        num_layers: int | None = None,
        stages_per_rank: int = 1,
    ) -> ParallelDims:
        """Check the sizes against the world and the model; return the resolved dims.

        Args:
            world_size: number of processes.
            num_attention_heads: heads of the backbone (``tp`` must divide it).
            ffn_hidden_size: MLP width (``tp`` must divide it).
            num_layers: backbone layers (there must be at least one per pipeline stage).
            stages_per_rank: pipeline stages each rank holds (2 for interleaved / V schedules).

        Raises:
            ValueError: naming the numbers that do not fit.
        """
        dims = self.resolve(world_size)
        if num_attention_heads is not None and num_attention_heads % dims.tp:
            raise ValueError(f"tp={dims.tp} does not divide the number of attention heads {num_attention_heads}")
        if ffn_hidden_size is not None and ffn_hidden_size % dims.tp:
            raise ValueError(f"tp={dims.tp} does not divide the MLP width ffn_hidden_size={ffn_hidden_size}")
        if num_layers is not None and dims.pp > 1:
            stages = dims.pp * stages_per_rank
            if stages > num_layers:
                one = " or a schedule with one stage per rank (pp_schedule: 1f1b)" if stages_per_rank > 1 else ""
                raise ValueError(
                    f"pp={dims.pp} x {stages_per_rank} stage(s) per rank = {stages} pipeline stages is more than "
                    f"the {num_layers} backbone layers (each stage needs at least one layer): use a backbone with at "
                    f"least {stages} layers (model.backbone, e.g. {{preset: tiny, num_layers: {stages}}}){one}, or a smaller pp"
                )
        return dims

    @property
    def dp(self) -> int:
        """Total data-parallel degree (``dp_replicate * dp_shard``); resolve first."""
        if self.dp_shard == -1:
            raise ValueError("dp_shard=-1 is unresolved; call resolve(world_size) first")
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def sizes(self) -> dict[str, int]:
        return {"pp": self.pp, "dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, "tp": self.tp}


def build_mesh(dims: ParallelDims, device_type: str = "cpu"):
    """Build the job's ``DeviceMesh`` (process group must already be initialised).

    Args:
        dims: resolved :class:`ParallelDims` (validate them first).
        device_type: ``"cpu"``, ``"cuda"`` or ``"musa"``.

    Returns:
        a 4-d ``DeviceMesh`` with dims :data:`MESH_DIMS` plus a flattened ``"dp"`` dimension.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        raise RuntimeError("build_mesh needs an initialised default process group (torch.distributed.init_process_group)")
    dims = dims.resolve(dist.get_world_size())
    shape = tuple(dims.sizes()[d] for d in MESH_DIMS)
    mesh = init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS)
    _DP[id(mesh)] = mesh["dp_replicate", "dp_shard"]._flatten("dp")
    logger.info("built device mesh %s on %s", dict(zip(MESH_DIMS, shape)), device_type)
    return mesh


def dp_mesh(mesh):
    """The flattened data-parallel mesh (``dp_replicate x dp_shard``) of a mesh from :func:`build_mesh`:
    the ranks that see different data (samplers, loss averaging)."""
    flat = _DP.get(id(mesh))
    if flat is None:
        flat = mesh["dp_replicate", "dp_shard"]._flatten("dp")
        _DP[id(mesh)] = flat
    return flat


def amax_group(mesh):
    """The process group over which FP8 delayed-scaling amaxes must be max-reduced.

    Every rank holding the *same* modules has to agree on their scales: the data- and tensor-parallel
    ranks of one pipeline stage (``dp_replicate x dp_shard x tp``). Without pipeline parallelism that
    is the whole world, and ``None`` (the default group) is returned.
    """
    if mesh["pp"].size() == 1:
        return None
    flat = _DPTP.get(id(mesh))
    if flat is None:
        flat = mesh["dp_replicate", "dp_shard", "tp"]._flatten("dp_tp")
        _DPTP[id(mesh)] = flat
    return flat.get_group()
