"""``MMTEStrategy``: DP x TP x PP for Lightning, on torch.distributed's own machinery.

Lightning's ``ModelParallelStrategy`` knows a 2-d (data, tensor) mesh and leaves the parallelisation to
the user; it has no pipeline parallelism. This strategy

* validates the sizes (and the model's head/layer counts when it can see them) *before* starting any
  process group, then builds one 4-d mesh ``(pp, dp_replicate, dp_shard, tp)`` with the backend that
  :func:`mmte.device.dist_backend` names (gloo / nccl / mccl);
* right after ``LightningModule.configure_model`` applies :func:`mmte.parallel.parallelize` to the
  module's ``model`` in torchtitan's order (FP8 -> PP -> TP -> AC -> compile -> FSDP2/DDP), unless the
  model already holds DTensor parameters (the module parallelised itself);
* with PP, switches the module to manual optimisation and runs the pipeline schedule inside the
  training step (:mod:`mmte.training.pipeline_runner`);
* saves and loads checkpoints that any layout reads (:mod:`mmte.training.sharded_checkpoint`).

YAML (``configs/parallel/tp2.yaml``)::

    trainer:
      strategy:
        class_path: mmte.training.strategy.MMTEStrategy
        init_args: {tp: 2, sequence_parallel: true}

or a registered name (``strategy: mmte_tp2``) once this module is imported.

What it needs from the LightningModule is :class:`~mmte.training.protocols.ParallelModule`
(:class:`~mmte.training.module.MMTEModule` implements it); any other module that exposes its network
as ``model`` gets the defaults of :class:`~mmte.training.protocols.PlainModule`. For PP the model's
``forward`` must take the previous stage's output positionally and skip parts that are ``None`` on a
stage.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry
from lightning.pytorch.trainer.states import TrainerFn
from torch import nn
from torch.distributed.tensor import DTensor

from .. import device as mdevice
from ..parallel import DDPConfig, FSDPConfig, ParallelConfig, ParallelDims, amax_group, build_mesh, dp_mesh, parallelize
from ..parallel.pipeline import stages_per_rank
from ..parallel.tp import find_backbones
from .pipeline_runner import PipelineRunner
from .protocols import ParallelModule, as_parallel_module
from .sharded_checkpoint import ShardedCheckpoints

logger = logging.getLogger(__name__)

__all__ = ["PRESETS", "MMTEStrategy"]


class MMTEStrategy(ShardedCheckpoints, ModelParallelStrategy):
    """Data x tensor(+sequence) x pipeline parallelism as a Lightning strategy.

    Args:
        tp: tensor-parallel degree.
        pp: pipeline-parallel degree.
        dp_replicate: DDP / HSDP replicas.
        dp_shard: FSDP2 shards (``-1``: the rest of the world).
        sequence_parallel: split norms/dropouts along the sequence (with ``tp > 1``).
        pp_schedule: ``gpipe``, ``1f1b``, ``interleaved_1f1b``, ``looped_bfs``, ``interleaved_zb``, ``zbv``,
            ``dualpipev``.
        microbatches: pipeline microbatches per step.
        virtual_stages: stages per rank for interleaved schedules.
        pp_balance: ``"compute"`` (trainable layers weigh 3, frozen 2), ``"layers"`` or ``"params"``.
        activation_checkpointing: ``"none"`` or ``"full"``.
        compile: ``torch.compile`` each backbone layer.
        fsdp: :class:`~mmte.parallel.FSDPConfig` fields (``reshard_after_forward``, ``param_dtype``,
            ``reduce_dtype``, ``prefetch``).
        ddp: :class:`~mmte.parallel.DDPConfig` fields (``bucket_cap_mb``, ``static_graph``).
        async_tp: overlap TP communication (CUDA + compile).
        save_distributed_checkpoint: False (default): one portable file of full tensors (the trainable part
            only, when the frozen backbone has a source) that one process or any other layout loads; True:
            a distributed (DCP) folder of shards for models too large to gather (``mmte convert`` turns it
            into a file).
        process_group_backend: override the backend (default from :func:`mmte.device.dist_backend`).
        timeout: process-group timeout.
    """

    strategy_name = "mmte"

    def __init__(
        self,
        tp: int = 1,
        pp: int = 1,
        dp_replicate: int = 1,
        dp_shard: int = -1,
        sequence_parallel: bool = False,
        pp_schedule: str = "1f1b",
        microbatches: int = 4,
        virtual_stages: int = 2,
        pp_balance: str = "compute",
        activation_checkpointing: str = "none",
        compile: bool = False,
        fsdp: dict | None = None,
        ddp: dict | None = None,
        async_tp: bool = False,
        save_distributed_checkpoint: bool = False,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        super().__init__(
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        self.dims = ParallelDims(dp_replicate=dp_replicate, dp_shard=dp_shard, tp=tp, pp=pp)
        self.parallel_config = ParallelConfig(
            sequence_parallel=sequence_parallel,
            pp_schedule=pp_schedule,
            microbatches=microbatches,
            virtual_stages=virtual_stages,
            pp_balance=pp_balance,
            activation_checkpointing=activation_checkpointing,
            compile=compile,
            fsdp=FSDPConfig(**(fsdp or {})),
            ddp=DDPConfig(**(ddp or {})),
            async_tp=async_tp,
        )
        self.parallelized = None
        self._pipeline: PipelineRunner | None = None

    # ------------------------------------------------------------------ environment
    def validate(self, world_size: int) -> ParallelDims:
        """Check sizes against the world (and against the module's backbone, if already built)."""
        hints: dict[str, Any] = {}
        module = self._lightning_module
        c = None
        if module is not None:
            api = as_parallel_module(module)
            full = api.meta_model()
            if full is None and isinstance(api.model, nn.Module):
                full = api.model
            if full is not None:
                bbs = find_backbones(full)
                c = bbs[0][1].config if bbs else None
            else:  # not built yet (configure_model comes later): read the backbone from hparams
                c = _config_from_hparams(api.hparams.get("backbone"))
        if c is not None:
            hints = {"num_attention_heads": c.num_attention_heads, "ffn_hidden_size": c.ffn_hidden_size, "num_layers": c.num_layers}
        spr = stages_per_rank(self.parallel_config.pp_schedule, self.parallel_config.virtual_stages) if self.dims.pp > 1 else 1
        return self.dims.validate(world_size, stages_per_rank=spr, **hints)

    def preflight(self, module, world_size: int, stage: str = "fit") -> ParallelDims:
        """Refuse, before any process starts, a combination that cannot work, with what to change: sizes
        against the world and the backbone (heads, MLP width, layers per pipeline stage), and what pipeline
        parallel cannot do (contrastive pairs, ``mmte predict``, plain DDP replicas). The ``mmte`` CLI
        calls it; :meth:`setup_environment` checks the sizes again in every process."""
        self._lightning_module = module
        try:
            dims = self.validate(world_size)
        finally:
            self._lightning_module = None
        hp = as_parallel_module(module).hparams
        if dims.pp > 1:
            if hp.get("fusion") == "separate":
                raise ValueError(
                    f"pipeline parallel (pp={dims.pp}) runs one token sequence per sample; fusion 'separate' (each modality "
                    "through the backbone on its own, e.g. contrastive pairs) cannot be pipelined: use data or tensor parallel"
                )
            if hp.get("mixup"):
                raise ValueError(
                    f"model.mixup {hp.get('mixup')} is not applied under pipeline parallel (pp={dims.pp}): the schedule splits "
                    "the batch into microbatches before any blending; set model.mixup 0, or use data or tensor parallel"
                )
            if stage == "predict":
                raise ValueError(
                    f"mmte predict does not run under pipeline parallel (pp={dims.pp}); checkpoints are portable: predict with "
                    "one process (drop the parallel fragment) or a data/tensor-parallel one"
                )
            if dims.dp_replicate > 1 and dims.dp_shard == 1:
                raise ValueError(
                    f"pp={dims.pp} with plain DDP (dp_replicate={dims.dp_replicate}) is not supported (DDP's reducer cannot follow "
                    "a pipeline schedule's split backward); use dp_shard for the data-parallel dimension"
                )
        return dims

    def setup_environment(self) -> None:
        # validation first: no process group exists yet
        self.dims = self.validate(self.num_nodes * self.num_processes)
        self._setup_distributed()
        self._device_mesh = build_mesh(self.dims, self.root_device.type)
        assert self.lightning_module is not None
        self.lightning_module._device_mesh = self._device_mesh

    def _get_process_group_backend(self) -> str:
        return self._process_group_backend or mdevice.dist_backend(self.root_device)

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        dp = dp_mesh(self.device_mesh)
        return {"num_replicas": dp.size(), "rank": dp.get_local_rank()}

    # ------------------------------------------------------------------ model
    @property
    def module_api(self) -> ParallelModule:
        """The LightningModule as :class:`~mmte.training.protocols.ParallelModule`."""
        return as_parallel_module(self.lightning_module)

    def parallelize_module(self, module) -> None:
        """Apply :func:`mmte.parallel.parallelize` to ``module.model`` (once)."""
        if self.parallelized is not None or getattr(module, "_mmte_parallelized", False):
            return
        api = as_parallel_module(module)
        model = api.model
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"MMTEStrategy needs the LightningModule to expose its network as `model` (an nn.Module); "
                f"{type(module).__name__}.model is {type(model).__name__}"
            )
        if any(isinstance(p, DTensor) for p in model.parameters()):
            module._mmte_parallelized = True  # the module parallelised itself in configure_model
            return
        loss_fn = api.pipeline_loss if self.dims.pp > 1 else None
        par = parallelize(model, self.device_mesh, self.parallel_config, loss_fn=loss_fn, fp8_convert=api.fp8_convert)
        api.model = par.model
        self.parallelized = par
        module._mmte_parallelized = True
        if self.dims.pp > 1:
            api.automatic_optimization = False
            self._pipeline = PipelineRunner(par, self.device_mesh, self.parallel_config, self.dims.pp, self.root_device)
            logger.info("pipeline parallel: %s switched to manual optimisation; the strategy runs the schedule", type(module).__name__)

    def setup(self, trainer) -> None:
        from lightning.fabric.strategies.model_parallel import _materialize_distributed_module

        assert self.model is not None and self.accelerator is not None
        self.accelerator.setup(trainer)
        plugin = self.precision_plugin
        if self.dims.pp > 1 and hasattr(plugin, "amax_reduction_group") and plugin.amax_reduction_group is None:
            # FP8 scales must agree among the ranks holding the same stage, not across stages
            plugin.amax_reduction_group = amax_group(self.device_mesh)
            logger.info("FP8 amax reduction over the stage's dp x tp group (%d ranks)", self.world_size // self.dims.pp)
        self.parallelize_module(self.lightning_module)
        module = self.lightning_module
        if any(p.is_meta for p in module.parameters()):
            self.module_api.materialize(self.root_device)  # reproducible per-shard init + strict pretrained load
        _materialize_distributed_module(self.model, self.root_device)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self.barrier()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            from lightning.fabric.utilities.optimizer import _optimizers_to_device as to_dev

            to_dev(self.optimizers, self.root_device)

    # ------------------------------------------------------------------ steps
    def training_step(self, *args: Any, **kwargs: Any):
        if self._pipeline is None:
            return super().training_step(*args, **kwargs)
        batch = args[0] if args else kwargs["batch"]
        # Lightning's wrappers: their step() advances the trainer's global step (max_steps, logging)
        opts = self.lightning_module.optimizers(use_pl_optimizer=True)
        opts = opts if isinstance(opts, list) else [opts]
        context = self.precision_plugin.train_step_context()
        return self._pipeline.train_step(self.module_api, batch, opts, self.lr_scheduler_configs, context)

    def _eval_step(self, stage: str, *args: Any, **kwargs: Any):
        batch = args[0] if args else kwargs["batch"]
        with self.precision_plugin.val_step_context() if stage == "val" else self.precision_plugin.test_step_context():
            return self._pipeline.step(self.module_api, batch, stage)

    def validation_step(self, *args: Any, **kwargs: Any):
        if self._pipeline is None:
            return super().validation_step(*args, **kwargs)
        return self._eval_step("val", *args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any):
        if self._pipeline is None:
            return super().test_step(*args, **kwargs)
        return self._eval_step("test", *args, **kwargs)

    def predict_step(self, *args: Any, **kwargs: Any):
        if self.dims.pp > 1:
            raise ValueError(
                "mmte predict does not run under pipeline parallel; checkpoints are portable: predict with one process "
                "(drop the parallel fragment) or with a data/tensor-parallel one"
            )
        return super().predict_step(*args, **kwargs)


def _config_from_hparams(spec):
    """A BackboneConfig from a module's ``backbone`` hyper-parameter (preset name, dict or config), else None."""
    from collections.abc import Mapping

    from ..encoders.presets import PRESETS as BACKBONE_PRESETS
    from ..encoders.presets import BackboneConfig, get_preset

    try:
        if isinstance(spec, BackboneConfig):
            return spec
        if isinstance(spec, str) and spec in BACKBONE_PRESETS:
            return get_preset(spec)
        if isinstance(spec, Mapping):
            cfg = dict(spec)
            preset = cfg.pop("preset", None) or cfg.pop("name", None)
            return get_preset(preset, **cfg) if preset else BackboneConfig(**cfg)
    except (TypeError, ValueError, KeyError):
        return None  # not a shape we understand: the check runs again in parallelize()
    return None


PRESETS: dict[str, dict[str, Any]] = {
    "mmte": {},
    "mmte_tp2": {"tp": 2, "sequence_parallel": True, "dp_shard": 1},
    "mmte_pp2_1f1b": {"pp": 2, "pp_schedule": "1f1b", "dp_shard": 1},
    "mmte_pp2_zbv": {"pp": 2, "pp_schedule": "zbv", "dp_shard": 1},
    "mmte_fsdp": {},
    "mmte_dp2_tp2": {"tp": 2, "dp_shard": 2, "sequence_parallel": True},
}


def _register(registry=StrategyRegistry) -> None:
    for name, kw in PRESETS.items():
        if name in registry:
            continue
        registry.register(name, MMTEStrategy, description=f"mmte DP x TP x PP strategy {kw or '(FSDP2 over all ranks)'}", **kw)


_register()
