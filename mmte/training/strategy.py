"""``MMTEStrategy``: DP x TP x PP for Lightning, on torch.distributed's own machinery.

Lightning's ``ModelParallelStrategy`` knows a 2-d (data, tensor) mesh and leaves the parallelisation to
the user; it has no pipeline parallelism. This strategy

* validates the sizes (and the model's head/layer counts when it can see them) *before* starting any
  process group, then builds one 4-d mesh ``(pp, dp_replicate, dp_shard, tp)`` with the backend that
  :func:`mmte.device.dist_backend` names (gloo / nccl / mccl);
* right after ``LightningModule.configure_model`` applies :func:`mmte.parallel.parallelize` to the
  module's ``model`` in torchtitan's order (FP8 -> PP -> TP -> AC -> compile -> FSDP2/DDP), unless the
  module already did it itself (``module.parallelize(mesh, config)`` hook, or DTensor parameters);
* with PP, switches the module to manual optimisation and runs the pipeline schedule inside the
  training step (zero_grad -> ``schedule.step`` -> optimizer step); the loss is broadcast from the last
  stage so every rank logs the same value.

YAML (``configs/parallel/tp2.yaml``)::

    trainer:
      strategy:
        class_path: mmte.training.strategy.MMTEStrategy
        init_args: {tp: 2, sequence_parallel: true}

or a registered name (``strategy: mmte_tp2``) once this module is imported.

What the LightningModule needs: a ``model`` attribute (an ``nn.Module`` containing an mmte
``Backbone``). For PP the model's ``forward`` must take the previous stage's output positionally and
skip parts that are ``None`` on a stage; the module may define ``pipeline_inputs(batch) -> (inputs,
target)`` (default: ``batch[0], batch[-1]``) and ``pipeline_loss(output, target)`` (default: its
``loss_fn`` attribute, else cross-entropy).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import torch
import torch.nn.functional as F
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry
from lightning.pytorch.trainer.states import TrainerFn
from torch import nn

from .. import device as mdevice
from ..parallel import DDPConfig, FSDPConfig, ParallelConfig, ParallelDims, amax_group, build_mesh, dp_mesh, parallelize
from ..parallel.pipeline import stages_per_rank
from ..parallel.tp import find_backbones

logger = logging.getLogger(__name__)

__all__ = ["PRESETS", "MMTEStrategy"]


class MMTEStrategy(ModelParallelStrategy):
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
        pp_balance: ``"layers"`` or ``"params"``.
        activation_checkpointing: ``"none"`` or ``"full"``.
        compile: ``torch.compile`` each backbone layer.
        fsdp: :class:`~mmte.parallel.FSDPConfig` fields (``reshard_after_forward``, ``param_dtype``,
            ``reduce_dtype``, ``prefetch``).
        ddp: :class:`~mmte.parallel.DDPConfig` fields (``bucket_cap_mb``, ``static_graph``).
        async_tp: overlap TP communication (CUDA + compile).
        save_distributed_checkpoint: DCP folders (True) or one consolidated file (False).
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
        pp_balance: str = "layers",
        activation_checkpointing: str = "none",
        compile: bool = False,
        fsdp: dict | None = None,
        ddp: dict | None = None,
        async_tp: bool = False,
        save_distributed_checkpoint: bool = True,
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

    # ------------------------------------------------------------------ environment
    def validate(self, world_size: int) -> ParallelDims:
        """Check sizes against the world (and against the module's backbone, if already built)."""
        hints: dict[str, Any] = {}
        module = self._lightning_module
        model = getattr(module, "model", None) if module is not None else None
        c = None
        if isinstance(model, nn.Module):
            bbs = find_backbones(model)
            c = bbs[0][1].config if bbs else None
        elif module is not None:  # not built yet (configure_model comes later): read the backbone from hparams
            c = _config_from_hparams(getattr(module, "hparams", {}).get("backbone"))
        if c is not None:
            hints = dict(num_attention_heads=c.num_attention_heads, ffn_hidden_size=c.ffn_hidden_size, num_layers=c.num_layers)
        spr = stages_per_rank(self.parallel_config.pp_schedule, self.parallel_config.virtual_stages) if self.dims.pp > 1 else 1
        return self.dims.validate(world_size, stages_per_rank=spr, **hints)

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
    def parallelize_module(self, module) -> None:
        """Apply :func:`mmte.parallel.parallelize` to ``module.model`` (once)."""
        if self.parallelized is not None or getattr(module, "_mmte_parallelized", False):
            return
        hook = getattr(module, "parallelize", None)
        if callable(hook):
            out = hook(self.device_mesh, self.parallel_config)
            self.parallelized = out
            module._mmte_parallelized = True
            return
        model = getattr(module, "model", None)
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"MMTEStrategy needs the LightningModule to expose its network as `model` (an nn.Module) or to "
                f"define parallelize(mesh, config); {type(module).__name__} has neither"
            )
        if any(hasattr(p, "_spec") for p in model.parameters()):
            module._mmte_parallelized = True  # the module parallelised itself in configure_model
            return
        loss_fn = self._loss_fn(module) if self.dims.pp > 1 else None
        fp8 = getattr(module, "fp8_convert", None)
        par = parallelize(model, self.device_mesh, self.parallel_config, loss_fn=loss_fn, fp8_convert=fp8 if callable(fp8) else None)
        module.model = par.model
        self.parallelized = par
        module._mmte_parallelized = True
        if self.dims.pp > 1:
            module.automatic_optimization = False
            logger.info("pipeline parallel: %s switched to manual optimisation; the strategy runs the schedule", type(module).__name__)

    @staticmethod
    def _loss_fn(module):
        fn = getattr(module, "pipeline_loss", None) or getattr(module, "loss_fn", None)
        return fn if callable(fn) else F.cross_entropy

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

    # ------------------------------------------------------------------ pipeline steps
    def _pipeline_inputs(self, batch):
        module = self.lightning_module
        fn = getattr(module, "pipeline_inputs", None)
        if callable(fn):
            return fn(batch)
        if isinstance(batch, (tuple, list)) and len(batch) >= 2:
            return batch[0], batch[-1]
        raise TypeError(
            f"pipeline parallel needs (inputs, target) from the batch: define {type(module).__name__}.pipeline_inputs(batch) "
            f"or return (x, y) batches; got {type(batch).__name__}"
        )

    def _run_schedule(self, batch) -> torch.Tensor:
        par = self.parallelized
        x, y = self._pipeline_inputs(batch)
        losses: list[torch.Tensor] = []
        kw = dict(target=y, losses=losses) if par.has_last_stage else {}
        if par.has_first_stage:
            par.schedule.step(x, **kw)
        else:
            par.schedule.step(**kw)
        local = torch.stack(losses).mean().detach() if losses else torch.zeros((), device=self.root_device)
        # the last stage's loss reaches every rank of the pipeline
        pp_group = self.device_mesh["pp"].get_group()
        holders = torch.tensor([1.0 if losses else 0.0], device=self.root_device)
        torch.distributed.all_reduce(local, group=pp_group)
        torch.distributed.all_reduce(holders, group=pp_group)
        return local / holders.clamp(min=1.0)

    def training_step(self, *args: Any, **kwargs: Any):
        if self.dims.pp == 1 or self.parallelized is None:
            return super().training_step(*args, **kwargs)
        batch = args[0] if args else kwargs["batch"]
        # Lightning's wrappers: their step() advances the trainer's global step (max_steps, logging)
        opts = self.lightning_module.optimizers(use_pl_optimizer=True)
        opts = opts if isinstance(opts, list) else [opts]
        with self.precision_plugin.train_step_context():
            for opt in opts:
                opt.zero_grad(set_to_none=True)
            loss = self._run_schedule(batch)
            for opt in opts:
                opt.step()
            for cfg in self.lr_scheduler_configs:
                if cfg.interval == "step":
                    cfg.scheduler.step()
        self.lightning_module.log("train_loss", loss, prog_bar=True, batch_size=_batch_size(batch))
        return loss

    def validation_step(self, *args: Any, **kwargs: Any):
        if self.dims.pp == 1 or self.parallelized is None:
            return super().validation_step(*args, **kwargs)
        batch = args[0] if args else kwargs["batch"]
        par = self.parallelized
        if len(par.stages) > 1:
            # torch 2.14's eval() of multi-stage (runtime) schedules still issues backward actions and fails
            # ("can't steal_bwd_input"): validate with gpipe/1f1b, or skip it here
            if not getattr(self, "_warned_pp_eval", False):
                from lightning.pytorch.utilities import rank_zero_warn

                rank_zero_warn(
                    f"validation under pipeline schedule {self.parallel_config.pp_schedule!r} (several stages per rank) "
                    "is skipped: torch.distributed.pipelining cannot run it forward-only; use gpipe or 1f1b to validate"
                )
                self._warned_pp_eval = True
            return None
        x, y = self._pipeline_inputs(batch)
        losses: list[torch.Tensor] = []
        kw = dict(target=y, losses=losses) if par.has_last_stage else {}
        with torch.no_grad():
            par.schedule.eval(x, **kw) if par.has_first_stage else par.schedule.eval(**kw)
        local = torch.stack(losses).mean() if losses else torch.zeros((), device=self.root_device)
        holders = torch.tensor([1.0 if losses else 0.0])
        pp_group = self.device_mesh["pp"].get_group()
        torch.distributed.all_reduce(local, group=pp_group)
        torch.distributed.all_reduce(holders, group=pp_group)
        loss = local / holders.clamp(min=1.0)
        self.lightning_module.log("val_loss", loss, prog_bar=True, batch_size=_batch_size(batch))
        return loss


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


def _batch_size(batch) -> int | None:
    t = batch[0] if isinstance(batch, (tuple, list)) else None
    return int(t.shape[0]) if isinstance(t, torch.Tensor) else None


PRESETS: dict[str, dict[str, Any]] = {
    "mmte": {},
    "mmte_tp2": dict(tp=2, sequence_parallel=True, dp_shard=1),
    "mmte_pp2_1f1b": dict(pp=2, pp_schedule="1f1b", dp_shard=1),
    "mmte_pp2_zbv": dict(pp=2, pp_schedule="zbv", dp_shard=1),
    "mmte_fsdp": dict(),
    "mmte_dp2_tp2": dict(tp=2, dp_shard=2, sequence_parallel=True),
}


def _register(registry=StrategyRegistry) -> None:
    for name, kw in PRESETS.items():
        if name in registry:
            continue
        registry.register(name, MMTEStrategy, description=f"mmte DP x TP x PP strategy {kw or '(FSDP2 over all ranks)'}", **kw)


_register()
