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
from ..parallel.pipeline import forward_only, microbatches_for, stages_per_rank
from ..parallel.tp import find_backbones
from .portable import FLAT, LIVE, consolidate, gather_full, is_flat, optim_from_flat, optim_to_flat

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

    # ------------------------------------------------------------------ environment
    def validate(self, world_size: int) -> ParallelDims:
        """Check sizes against the world (and against the module's backbone, if already built)."""
        hints: dict[str, Any] = {}
        module = self._lightning_module
        model = getattr(module, "model", None) if module is not None else None
        c = None
        full = getattr(module, "_full_meta", None)
        if callable(full):
            c = full().backbone.config
        elif isinstance(model, nn.Module):
            bbs = find_backbones(model)
            c = bbs[0][1].config if bbs else None
        elif module is not None:  # not built yet (configure_model comes later): read the backbone from hparams
            c = _config_from_hparams(getattr(module, "hparams", {}).get("backbone"))
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
        hp = getattr(module, "hparams", {}) or {}
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
        module = self.lightning_module
        if callable(getattr(module, "materialize", None)) and any(p.is_meta for p in module.parameters()):
            module.materialize(self.root_device)  # reproducible per-shard init + strict pretrained load
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

    # ------------------------------------------------------------------ checkpoints
    @property
    def lightning_restore_optimizer(self) -> bool:
        return True  # load_optimizer_state_dict below maps FQN-keyed states onto this rank's optimizer

    def _contributes(self) -> bool:
        """One rank per pipeline stage sends its full (gathered) tensors to rank 0."""
        return all(self.device_mesh[d].get_local_rank() == 0 for d in ("dp_replicate", "dp_shard", "tp"))

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """Full tensors under the model's FQNs, merged across pipeline stages, on rank 0 (``{}`` elsewhere);
        DTensor shards with ``save_distributed_checkpoint``."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if self._save_distributed_checkpoint:
            return super().lightning_module_state_dict()
        local = get_model_state_dict(self.lightning_module, options=StateDictOptions(full_state_dict=True))
        return gather_full({k: v.detach().cpu() for k, v in local.items()}, self._contributes())

    def optimizer_state(self, optimizer) -> dict[str, Any]:
        """FQN-keyed (flattened) optimizer state: full and merged across stages on rank 0, or this rank's
        shards with ``save_distributed_checkpoint``."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        opt = getattr(optimizer, "_optimizer", optimizer)
        full = not self._save_distributed_checkpoint
        local: dict[str, Any] = {}
        if not _placeholder_only(opt):
            options = StateDictOptions(full_state_dict=full, flatten_optimizer_state_dict=True)
            local = get_optimizer_state_dict(self.lightning_module, opt, options=options)
            if full:
                local = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in local.items()}
        return gather_full(local, self._contributes()) if full else local

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Any | None = None) -> None:
        checkpoint.setdefault("mmte", {}).update(optimizer_format=FLAT, layout=self.dims.sizes())
        if self._save_distributed_checkpoint and isinstance(checkpoint.get("current_model_state"), dict):
            # Lightning saves only state_dict and the optimizer states as shards (the rest is rank 0's meta.pt):
            # the live weights beside averaged ones go with state_dict; consolidate() takes them out again
            live = checkpoint.pop("current_model_state")
            checkpoint["state_dict"] = {**checkpoint["state_dict"], **{f"{LIVE}{k}": v for k, v in live.items()}}
        super().save_checkpoint(checkpoint, filepath, storage_options)

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        """Read a portable file, or consolidate a distributed checkpoint folder in memory, on every rank;
        :meth:`load_model_state_dict` / :meth:`load_optimizer_state_dict` then take this rank's slices."""
        from pathlib import Path

        path = Path(self.broadcast(str(checkpoint_path)))
        if path.is_dir():
            return consolidate(path)
        return self.checkpoint_io.load_checkpoint(path, weights_only=False if weights_only is None else weights_only)

    def load_model_state_dict(self, checkpoint, strict: bool = True) -> None:
        from ..parallel.materialize import copy_full

        module = self.lightning_module
        sd = checkpoint["state_dict"]
        own = module.state_dict(keep_vars=True)
        missing = sorted(k for k in own if k not in sd)
        full = getattr(module, "_full_meta", None)
        known = set(own) | ({f"model.{k}" for k in full().state_dict()} if callable(full) else set(sd))
        unexpected = sorted(k for k in sd if k not in known and not k.rsplit(".", 1)[-1].startswith("fp8_"))
        if strict and (missing or unexpected):
            raise ValueError(
                f"checkpoint does not fit the model: missing {missing[:8]}{' ...' if len(missing) > 8 else ''}, "
                f"unexpected {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}"
            )
        for k, t in own.items():
            if k in sd:
                copy_full(t, sd[k].to(t.device if t.device.type != "meta" else "cpu"))

    def load_optimizer_state_dict(self, checkpoint) -> None:
        """Load a checkpoint's optimizer state into this rank's optimizer, whatever layout wrote it.

        The state is keyed by parameter FQN (a single-process checkpoint's positional state is converted
        first); each tensor is the full one and this rank keeps its slice of it where the parameter is a
        DTensor (TP / FSDP), the whole tensor otherwise; group options (lr, weight decay...) come along.
        """
        from ..parallel.materialize import copy_full

        module = self.lightning_module
        local = dict(module.named_parameters())
        for opt, state in zip(self.optimizers, checkpoint.get("optimizer_states") or []):
            opt = getattr(opt, "_optimizer", opt)
            if _placeholder_only(opt):
                continue
            if not is_flat(state):  # a single-process checkpoint: positions follow the whole model's groups
                state = optim_to_flat(state, module.optimizer_param_names())
            ids = {id(p): n for n, p in local.items()}
            names = [[ids[id(p)] for p in g["params"]] for g in opt.param_groups]
            native = optim_from_flat(state, names)
            params = [p for g in opt.param_groups for p in g["params"]]
            for pid, per in native["state"].items():
                param = params[pid]
                for k, v in per.items():
                    if isinstance(v, torch.Tensor) and v.dim() > 0 and tuple(v.shape) == tuple(param.shape):
                        dst = torch.zeros_like(param, dtype=v.dtype)
                        copy_full(dst, v.to(dst.to_local().device if hasattr(dst, "to_local") else dst.device))
                        per[k] = dst
            opt.load_state_dict(native)

    # ------------------------------------------------------------------ pipeline steps
    def _pipeline_inputs(self, batch):
        module = self.lightning_module
        fn = getattr(module, "pipeline_inputs", None)
        if callable(fn):
            return fn(batch)
        if isinstance(batch, (tuple, list)) and len(batch) >= 2:
            return (batch[0],), {}, batch[-1]
        raise TypeError(
            f"pipeline parallel needs (inputs, target) from the batch: define {type(module).__name__}.pipeline_inputs(batch) "
            f"or return (x, y) batches; got {type(batch).__name__}"
        )

    def _pipeline_step(self, batch, stage: str) -> torch.Tensor | None:
        """Run the schedule on one batch and hand the last stage's merged outputs to the module's
        ``pipeline_outputs`` hook on every rank (None where the rank holds no last stage), so every rank
        logs the same names.

        Training (``stage="train"``): the schedule, forward + backward over equal microbatches (the
        largest count up to ``microbatches`` that divides the batch and that the schedule accepts); a
        batch that cannot be split so (an epoch's short last batch) is skipped with a warning.
        Evaluation: the whole batch forward through the stages in order (:func:`~mmte.parallel.pipeline.
        forward_only`; any batch size, any schedule's placement, no bubble-filling needed).
        """
        par = self.parallelized
        module = self.lightning_module
        cfg = self.parallel_config
        args, kwargs, target = self._pipeline_inputs(batch)
        n = int(target.shape[0])
        train = stage == "train"
        if train:
            m = microbatches_for(n, cfg.pp_schedule, cfg.microbatches, self.dims.pp, par.schedule._num_stages)
            if m is None:
                from lightning.pytorch.utilities import rank_zero_warn

                rank_zero_warn(
                    f"skipped a training batch of {n} samples: {cfg.pp_schedule} with pp={self.dims.pp} needs it split into "
                    f"equal microbatches (at most {cfg.microbatches}); use batch sizes that are a multiple of {cfg.microbatches}"
                )
                return None
        key = (train, _shape_key((args, kwargs)))
        self._share_boundary(key, kwargs)
        losses: list[torch.Tensor] = []
        if train:
            sched = par.schedule_for(key, m)
            kw = {"target": target, "losses": losses} if par.has_last_stage else {}
            if par.has_first_stage:
                kw.update(kwargs)
            out = sched.step(*args, **kw) if par.has_first_stage else sched.step(**kw)
        else:
            out = forward_only(par.stage_modules, par.owners, self.device_mesh["pp"].get_group(), *args, **kwargs)
            if out is not None and not callable(getattr(module, "pipeline_outputs", None)):
                losses = [self._loss_fn(module)(out, target)]
        hook = getattr(module, "pipeline_outputs", None)
        if callable(hook):
            local = hook(out if par.has_last_stage else None, batch, stage, losses)
        else:
            local = torch.stack([x.detach().float() for x in losses]).mean() if losses else None
        # the last stage's loss reaches every rank of the pipeline
        has = local is not None
        local = (local.detach().float() if has else torch.zeros(())).to(self.root_device)
        holders = torch.tensor([1.0 if has else 0.0], device=self.root_device)
        pp_group = self.device_mesh["pp"].get_group()
        torch.distributed.all_reduce(local, group=pp_group)
        torch.distributed.all_reduce(holders, group=pp_group)
        loss = local / holders.clamp(min=1.0)
        log = getattr(module, "pipeline_log", None)
        if callable(log):
            log(batch, stage, loss)
        else:
            module.log(f"{stage}_loss", loss, prog_bar=True, batch_size=_batch_size(batch))
        return loss

    def _share_boundary(self, key, kwargs) -> None:
        """The first stage's rank tells the other pipeline ranks what the stages will pass each other
        (once per batch shape): shape inference on the later stages runs on uninitialised tensors, so the
        structure cannot travel inside them. It is computed by calling the first stage itself (on one
        sample) so FSDP2-sharded tokenizers run inside their root's forward."""
        module = self.lightning_module
        setter = getattr(module, "set_pipeline_boundary", None)
        if not callable(setter):
            return
        known = getattr(self, "_boundaries", None)
        if known is None:
            known = self._boundaries = {}
        if key not in known:
            from torch.utils._pytree import tree_map

            first = dict(self.parallelized.stage_modules).get(0)
            obj = [None]
            if first is not None:
                one = tree_map(lambda t: t[:1] if isinstance(t, torch.Tensor) and t.dim() > 0 else t, kwargs)
                with torch.no_grad():
                    obj = [first(**one, boundary=True)]
            group = self.device_mesh["pp"].get_group()
            torch.distributed.broadcast_object_list(obj, src=torch.distributed.get_global_rank(group, 0), group=group)
            known[key] = obj[0]
        setter(known[key])

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
            loss = self._pipeline_step(batch, "train")
            for opt in opts:
                opt.step()
            for cfg in self.lr_scheduler_configs:
                if cfg.interval == "step":
                    cfg.scheduler.step()
        return loss

    def _eval_step(self, stage: str, *args: Any, **kwargs: Any):
        batch = args[0] if args else kwargs["batch"]
        with self.precision_plugin.val_step_context() if stage == "val" else self.precision_plugin.test_step_context():
            return self._pipeline_step(batch, stage)

    def validation_step(self, *args: Any, **kwargs: Any):
        if self.dims.pp == 1 or self.parallelized is None:
            return super().validation_step(*args, **kwargs)
        return self._eval_step("val", *args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any):
        if self.dims.pp == 1 or self.parallelized is None:
            return super().test_step(*args, **kwargs)
        return self._eval_step("test", *args, **kwargs)

    def predict_step(self, *args: Any, **kwargs: Any):
        if self.dims.pp > 1:
            raise ValueError(
                "mmte predict does not run under pipeline parallel; checkpoints are portable: predict with one process "
                "(drop the parallel fragment) or with a data/tensor-parallel one"
            )
        return super().predict_step(*args, **kwargs)


def _placeholder_only(opt) -> bool:
    """An optimizer of a pipeline rank that holds nothing to train (see MMTEModule._param_groups)."""
    return all(getattr(p, "_mmte_placeholder", False) for g in opt.param_groups for p in g["params"])


def _shape_key(tree) -> tuple:
    from torch.utils._pytree import tree_flatten

    leaves, _ = tree_flatten(tree)
    return tuple((tuple(t.shape), str(t.dtype)) if isinstance(t, torch.Tensor) else type(t).__name__ for t in leaves)


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
