"""``MetaTransformer``: modality tokenizers -> one shared backbone -> task heads.

Constructor (every argument is plain data, so a YAML file can hold it; see :func:`create_model`)::

    MetaTransformer(
        tokenizers={                               # batch key -> tokenizer
            "audio": "audio",                      #   a registry name (default config),
            "image": {"name": "image", "img_size": 224, "patch_size": 16},  # name + config,
            "ecg":   my_tokenizer_module,          #   or a ready nn.Module returning TokenSeq.
        },                                         # ("name" defaults to the key)
        backbone="meta-transformer-b16",           # preset name | BackboneConfig | Backbone | Encoder
        heads={                                    # head name -> head
            "digit": {"name": "classification", "inputs": "audio", "target": "label",
                      "num_classes": 10, "pool": "mean"},
            "clip":  {"name": "contrastive", "inputs": ["image", "text"], "embed_dim": 256},
        },                                         # or an mmte.heads.Head module
        fusion="single",                           # "single" | "joint" | "separate"
        freeze="backbone",                         # "backbone" | "tokenizers" | "none" | [globs]
        lora=None,                                 # mmte.config.LoRAConfig or {"rank": 8, "alpha": 16, "dropout": 0.0, "lr_scale": 1.0,
                                                   #  "targets": ["layers.*.self_attention.layernorm_qkv.linear", ...]}
        backbone_weights=None,                     # path (.safetensors / .pth) | Backbone
        touch_unused=True,                         # DDP-safe when a batch lacks a modality
        fused=False,                               # regional torch.compile of the backbone layers
        device=None,                               # "meta" to build without memory
    )

* **tokenizers**: keys are the batch keys; every tokenizer gets ``dim = backbone hidden size``.
* **heads**: ``name`` is a head-registry name (:mod:`mmte.heads`); ``inputs`` the modality or
  modalities it reads (default: all tokenizers); ``target`` the batch key of its target (default:
  the head's own, ``"label"`` for classification/regression, ``"target"`` for forecasting,
  ``"token_labels"`` for token-level, none for contrastive); ``weight`` its loss weight (1.0); the rest
  are the head's keyword arguments. Without ``name`` a head reading one registry-built modality is
  that modality's default head (e.g. ``{"num_classes": 10}`` on audio: mean-pooled classification).
  Head names must not be ``"loss"``.
* **fusion**:
  ``"single"`` one tokenizer, the backbone sees its tokens;
  ``"joint"`` the present modalities' token sequences are concatenated (in tokenizer order) into one
  sequence, each plus a learned modality-type embedding (``modality_embed.weight[i]``), masks
  concatenated; heads read the joint sequence (cls pooling = the first modality's first token);
  ``"separate"`` each present modality goes through the backbone on its own (contrastive pairs);
  a head reads its one modality, a multi-input head (contrastive) all of its modalities.
* **freeze**: ``"backbone"`` (the Meta-Transformer default; LoRA adapters stay trainable),
  ``"tokenizers"`` (tokenizers and modality embeddings), ``"none"``, or a list of globs matched
  against parameter names (``"backbone.layers.0.*"``). Applied at construction; :meth:`freeze` re-applies.
* **lora**: adapters ``W x + (alpha/rank) B A x`` added (as a forward hook, so FQNs stay stable) to
  the backbone's Linears matching ``targets`` (default: QKV and attention projection); ``B`` starts at
  zero so the model's output is unchanged at init; ``lr_scale`` multiplies the adapters' learning rate
  (e.g. 0.1: a pretrained trunk's adapters step ten times smaller than the new tokenizer and head).
  Parameters ``backbone.<linear>.lora.A/B``. The
  adapter lives on the Linear module: a later pass that *replaces* Linears (an FP8 conversion) must
  carry ``lora`` and the hook over, or run before LoRA is added.
* **backbone_weights**: a file read with :func:`mmte.encoders.load_state_dict_file` holding mmte
  backbone keys (optionally prefixed ``backbone.``) or the Meta-Transformer release's keys
  (``0.attn.qkv.weight``...); or a built ``Backbone``. With ``device="meta"`` the file is loaded by
  :meth:`load_backbone_weights` after materialisation.

Batch format: ``{modality: tensor or dict of tensors, target_key: tensor, ...}`` where a modality's
value is what its collate function returns (a dict is passed as keyword arguments to the tokenizer).
Modalities may be absent from a batch; heads whose inputs are all absent are skipped.

Methods:

* ``forward(batch) -> {head_name: output}`` = ``forward_heads(forward_backbone(forward_tokens(batch)))``.
* ``forward_tokens(batch) -> {modality: TokenSeq}`` for the modalities present.
* ``forward_backbone(seqs) -> {key: (hidden [B, N, D], TokenSeq)}``; keys are the modalities, or
  ``"joint"`` for joint fusion.
* ``forward_heads(features) -> {head_name: output}``.
* ``loss(outputs, batch) -> {head_name: loss, ..., "loss": weighted sum}`` (each head's own loss
  against ``batch[head.target]``).
* ``reset_parameters()`` re-initialises every module; ``load_backbone_weights()``;
  ``trainable_parameter_names()``.

Unused parameters under DDP: when a batch lacks a modality, that tokenizer's (and skipped heads')
parameters get no gradient, which plain DDP rejects. With ``touch_unused=True`` (default) ``forward``
adds ``0 * sum(unused trainable parameters)`` to its first output while grad is enabled, so every
trainable parameter receives a (zero) gradient and ``find_unused_parameters=False`` works. With
``touch_unused=False`` use DDP's ``find_unused_parameters=True``.

Meta-device construction: ``MetaTransformer(..., device="meta")`` allocates nothing; materialise with
``model.to_empty(device=...)`` then ``reset_parameters()`` on every module that owns parameters
(what Lightning does) or ``model.reset_parameters()``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .config import LoRAConfig
from .encoders import Backbone, BackboneConfig, Encoder, load_state_dict_file
from .encoders.weights import load_backbone_state, normalize_backbone_keys
from .heads import Head
from .lora import DEFAULT_LORA_TARGETS, LoRA, apply_lora
from .model_parts import (
    FREEZE_POLICIES,
    FUSIONS,
    ModalityEmbedding,
    build_backbone,
    build_head,
    build_tokenizer,
    freeze_parameters,
    join_sequences,
    touch_unused,
)
from .model_stages import PipelineStages
from .seq import TokenSeq

logger = logging.getLogger(__name__)

# LoRA, the part builders and the backbone-weight loaders live in mmte.lora, mmte.model_parts and
# mmte.encoders.weights; their names are re-exported here
__all__ = [
    "DEFAULT_LORA_TARGETS",
    "FREEZE_POLICIES",
    "FUSIONS",
    "LoRA",
    "MetaTransformer",
    "ModalityEmbedding",
    "apply_lora",
    "create_model",
    "load_backbone_state",
    "normalize_backbone_keys",
]


class MetaTransformer(PipelineStages, nn.Module):
    """Tokenizers by modality -> a shared backbone -> heads by task. See the module docstring."""

    def __init__(
        self,
        tokenizers: Mapping[str, str | Mapping[str, Any] | nn.Module],
        backbone: str | BackboneConfig | Backbone | Encoder = "meta-transformer-b16",
        heads: Mapping[str, Mapping[str, Any] | Head] | None = None,
        *,
        fusion: str = "single",
        freeze: str | Sequence[str] = "backbone",
        lora: LoRAConfig | Mapping[str, Any] | None = None,
        backbone_weights: str | os.PathLike | Backbone | None = None,
        touch_unused: bool = True,
        fused: bool = False,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        if not isinstance(tokenizers, Mapping) or not tokenizers:
            raise ValueError(f"tokenizers must be a non-empty mapping modality -> spec; got {tokenizers!r}")
        if fusion not in FUSIONS:
            raise ValueError(f"fusion must be one of {FUSIONS}; got {fusion!r}")
        if fusion == "single" and len(tokenizers) != 1:
            raise ValueError(f"fusion='single' takes exactly one tokenizer; got {list(tokenizers)} (use 'joint' or 'separate')")
        self.fusion, self.touch_unused = fusion, touch_unused
        self._backbone_weights = None
        # set on the pruned stage views that mmte.parallel.pipeline_split makes; shared with them (shallow
        # copies share this dict): the last stage records its output structure here for the loss
        self.pipeline_stage: int | None = None
        self._pipeline_io: dict[str, Any] = {}
        ctx = torch.device(device) if device is not None else contextlib.nullcontext()
        with ctx:
            self.backbone = build_backbone(backbone, backbone_weights)
            dim = self.backbone.hidden_size
            self.dim = dim
            built = {k: build_tokenizer(k, v, dim) for k, v in tokenizers.items()}
            self.modality_names: dict[str, str | None] = {k: name for k, (_, name) in built.items()}
            self.tokenizers = nn.ModuleDict({k: tok for k, (tok, _) in built.items()})
            self.modality_embed = ModalityEmbedding(list(tokenizers), dim) if fusion == "joint" else None
            self.heads = nn.ModuleDict(
                {k: build_head(k, v, dim, modality_names=self.modality_names, fusion=fusion) for k, v in (heads or {}).items()}
            )
        if isinstance(backbone_weights, (str, os.PathLike)):
            self._backbone_weights = os.fspath(backbone_weights)
            if not any(p.is_meta for p in self.backbone.parameters()):
                self.load_backbone_weights()
        lora_cfg = LoRAConfig.from_value(lora)  # a mapping is checked like the recipe's (unknown options, ranges)
        self.lora_modules = apply_lora(self.backbone, **lora_cfg.as_dict()) if lora_cfg is not None else []
        if fused:
            self.backbone.fuse()
        self.freeze_policy = freeze
        self.freeze(freeze)

    # ------------------------------------------------------------------------------------ weights
    def load_backbone_weights(self, path: str | os.PathLike | None = None) -> None:
        """Load backbone weights (mmte or Meta-Transformer-release keys) strictly, LoRA adapters aside."""
        path = path or self._backbone_weights
        if path is None:
            raise ValueError("no backbone_weights path was given")
        n = load_backbone_state(self.backbone, load_state_dict_file(path), source=os.fspath(path))
        logger.info("loaded %d backbone tensors from %s", n, path)

    # ---------------------------------------------------------------------------- freezing, init
    def freeze(self, policy: str | Sequence[str]) -> list[str]:
        """Apply a freeze policy (:func:`mmte.model_parts.freeze_parameters`); returns the trainable parameters' names."""
        names = freeze_parameters(self, policy)
        self.freeze_policy = policy
        return names

    def trainable_parameter_names(self) -> list[str]:
        return [n for n, p in self.named_parameters() if p.requires_grad]

    def reset_parameters(self) -> None:
        """Re-initialise every sub-module that owns parameters (after ``to_empty``)."""
        for m in self.modules():
            if m is not self and any(True for _ in m.parameters(recurse=False)):
                if not hasattr(m, "reset_parameters"):
                    raise TypeError(f"{type(m).__name__} owns parameters but has no reset_parameters()")
                m.reset_parameters()

    # ---------------------------------------------------------------------------------- forward
    def forward_tokens(self, batch: Mapping[str, Any]) -> dict[str, TokenSeq]:
        """Tokenize every modality present in ``batch`` -> ``{modality: TokenSeq}``."""
        if not isinstance(batch, Mapping):
            raise TypeError(f"batch must be a mapping {{modality: tensor | dict, target: tensor}}; got {type(batch).__name__}")
        seqs = {}
        for m, tok in self.tokenizers.items():
            x = batch.get(m)
            if x is None:
                continue
            seq = tok(**x) if isinstance(x, Mapping) else tok(x)
            if not isinstance(seq, TokenSeq):
                raise TypeError(f"tokenizer {m!r} returned {type(seq).__name__}; expected TokenSeq")
            seqs[m] = seq
        if not seqs:
            raise ValueError(f"batch holds none of the model's modalities {list(self.tokenizers)}; got keys {sorted(batch)}")
        return seqs

    def _joint(self, seqs: Mapping[str, TokenSeq]) -> TokenSeq:
        return join_sequences(seqs, self.modality_embed)

    def forward_backbone(self, seqs: Mapping[str, TokenSeq]) -> dict[str, tuple[torch.Tensor, TokenSeq]]:
        """Run the backbone: ``{modality: (hidden [B, N, D], seq)}``, or ``{"joint": ...}``."""
        if self.fusion == "joint":
            seq = self._joint(seqs)
            return {"joint": (self.backbone(seq.tokens, seq.mask), seq)}
        return {m: (self.backbone(s.tokens, s.mask), s) for m, s in seqs.items()}

    def forward_heads(self, features: Mapping[str, tuple[torch.Tensor, TokenSeq]]) -> dict[str, Any]:
        """Apply every head whose inputs are present -> ``{head_name: output}``."""
        out = {}
        for name, head in self.heads.items():
            if self.fusion == "joint":
                if "joint" in features and any(m in features["joint"][1].extras.get("segments", {}) for m in head.inputs):
                    out[name] = head(*features["joint"]) if not head.multi_input else head({m: features["joint"] for m in head.inputs})
            elif head.multi_input:
                if all(m in features for m in head.inputs):
                    out[name] = head({m: features[m] for m in head.inputs})
            elif head.inputs[0] in features:
                out[name] = head(*features[head.inputs[0]])
        return out

    def forward(self, *inputs: Any, batch: Mapping[str, Any] | None = None, boundary: bool = False) -> dict[str, Any]:
        """``model(batch)`` -> ``{head_name: output}`` for the heads whose modalities are in ``batch``.

        On a pipeline stage view (``pipeline_stage`` set) this is :meth:`forward_stage`; on the first
        stage, ``boundary=True`` returns :meth:`pipeline_boundary` instead (computed inside the stage's
        own call, so wrappers such as FSDP2 see it as that module's forward).
        """
        if self.pipeline_stage is not None:
            if boundary:
                return self.pipeline_boundary(batch)
            return self.forward_stage(*inputs, batch=batch)
        if batch is None:
            if len(inputs) != 1:
                raise TypeError(f"MetaTransformer takes one batch dict; got {len(inputs)} positional inputs")
            batch = inputs[0]
        seqs = self.forward_tokens(batch)
        out = self.forward_heads(self.forward_backbone(seqs))
        if self.touch_unused and torch.is_grad_enabled() and out:
            out = touch_unused(self, out, set(seqs))
        return out

    def inference(self, dtype: str = "auto", compile: bool = False, **kwargs: Any) -> nn.Module:
        """A frozen eval-mode copy for prediction: backbone in bf16 where the CPU has native bf16 (``"auto"``),
        run under ``torch.inference_mode``, optionally compiled. See :func:`mmte.inference.optimize`."""
        from .inference import optimize

        return optimize(self, dtype, compile, **kwargs)

    def loss(self, outputs: Mapping[str, Any], batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Each head's loss against ``batch[head.target]`` and their weighted sum under ``"loss"``."""
        losses: dict[str, torch.Tensor] = {}
        total = None
        for name, o in outputs.items():
            head = self.heads[name]
            target = None
            if head.target is not None:
                if head.target not in batch:
                    raise ValueError(f"head {name!r} needs target key {head.target!r}; batch has {sorted(batch)}")
                target = batch[head.target]
            l = head.loss(o, target)
            losses[name] = l
            total = l * head.loss_weight if total is None else total + l * head.loss_weight
        if total is None:
            raise ValueError("no head produced an output for this batch, so there is no loss")
        losses["loss"] = total
        return losses


def create_model(config: Mapping[str, Any] | str | os.PathLike | None = None, **overrides: Any) -> MetaTransformer:
    """Build a :class:`MetaTransformer` from a dict or a YAML file of its constructor arguments.

    A YAML file may hold the arguments at top level or under a ``model:`` key; ``overrides`` win.
    """
    cfg: dict[str, Any] = {}
    if isinstance(config, (str, os.PathLike)):
        import yaml

        with open(config) as f:
            cfg = yaml.safe_load(f) or {}
        if "model" in cfg and isinstance(cfg["model"], Mapping):
            cfg = dict(cfg["model"])
    elif isinstance(config, Mapping):
        cfg = dict(config)
    elif config is not None:
        raise TypeError(f"config must be a dict or a YAML path; got {type(config).__name__}")
    cfg.update(overrides)
    if "tokenizers" not in cfg:
        raise ValueError(f"model config needs 'tokenizers'; got keys {sorted(cfg)}")
    return MetaTransformer(**cfg)
