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
        lora=None,                                 # {"rank": 8, "alpha": 16, "dropout": 0.0,
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
  zero so the model's output is unchanged at init. Parameters ``backbone.<linear>.lora.A/B``. The
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
import fnmatch
import logging
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from . import heads as heads_mod
from .encoders import Backbone, BackboneConfig, Encoder, load_state_dict_file
from .encoders.weights import load_backbone_state, normalize_backbone_keys
from .heads import Head
from .model_stages import PipelineStages
from .seq import TokenSeq
from .tokenizers.registry import get_modality

logger = logging.getLogger(__name__)

__all__ = ["FUSIONS", "LoRA", "MetaTransformer", "ModalityEmbedding", "apply_lora", "create_model", "load_backbone_state", "normalize_backbone_keys"]

FUSIONS = ("single", "joint", "separate")
FREEZE_POLICIES = ("backbone", "tokenizers", "none")
DEFAULT_LORA_TARGETS = ("layers.*.self_attention.layernorm_qkv.linear", "layers.*.self_attention.proj")


class LoRA(nn.Module):
    """A low-rank adapter ``scale * B A x`` for one Linear (``A`` [r, in], ``B`` [out, r])."""

    def __init__(self, in_features: int, out_features: int, rank: int = 8, alpha: float = 16.0, dropout: float = 0.0):
        super().__init__()
        if not isinstance(rank, int) or rank < 1:
            raise ValueError(f"LoRA rank must be a positive int; got {rank!r}")
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        self.A = nn.Parameter(torch.empty(rank, in_features))
        self.B = nn.Parameter(torch.empty(out_features, rank))
        self.dropout = nn.Dropout(dropout)
        if self.A.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))
        nn.init.zeros_(self.B)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.dropout(x) @ self.A.t().to(x.dtype)) @ self.B.t().to(x.dtype) * self.scale


def _lora_hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
    return output + module.lora(inputs[0])


def apply_lora(backbone: nn.Module, rank: int = 8, alpha: float = 16.0, dropout: float = 0.0, targets: Sequence[str] | None = None) -> list[str]:
    """Attach :class:`LoRA` adapters to the ``nn.Linear`` modules of ``backbone`` matching ``targets``.

    Returns:
        the adapted module names.

    Raises:
        ValueError: when a target glob matches no Linear.
    """
    targets = list(targets or DEFAULT_LORA_TARGETS)
    done = []
    for pattern in targets:
        hits = [(n, m) for n, m in backbone.named_modules() if isinstance(m, nn.Linear) and fnmatch.fnmatch(n, pattern)]
        if not hits:
            raise ValueError(f"LoRA target {pattern!r} matches no Linear in the backbone (e.g. 'layers.*.layernorm_mlp.fc1')")
        for n, m in hits:
            if hasattr(m, "lora"):
                continue
            m.lora = LoRA(m.in_features, m.out_features, rank, alpha, dropout).to(device=m.weight.device)
            m.register_forward_hook(_lora_hook)
            done.append(n)
    logger.info("added LoRA (rank %d) to %d backbone Linears", rank, len(done))
    return done


class ModalityEmbedding(nn.Module):
    """Learned modality-type embeddings ``weight`` [M, D] for joint fusion."""

    def __init__(self, names: Sequence[str], dim: int):
        super().__init__()
        self.names = list(names)
        self.weight = nn.Parameter(torch.empty(len(self.names), dim))
        if self.weight.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.trunc_normal_(self.weight, std=0.02)

    def forward(self, name: str) -> torch.Tensor:
        return self.weight[self.names.index(name)]


def _as_list(x: str | Sequence[str] | None) -> list[str] | None:
    if x is None:
        return None
    return [x] if isinstance(x, str) else list(x)


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
        lora: Mapping[str, Any] | None = None,
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
            self.backbone = self._build_backbone(backbone, backbone_weights)
            dim = self.backbone.hidden_size
            self.dim = dim
            self.modality_names: dict[str, str | None] = {}
            self.tokenizers = nn.ModuleDict({k: self._build_tokenizer(k, v, dim) for k, v in tokenizers.items()})
            self.modality_embed = ModalityEmbedding(list(tokenizers), dim) if fusion == "joint" else None
            self.heads = nn.ModuleDict({k: self._build_head(k, v, dim) for k, v in (heads or {}).items()})
        if isinstance(backbone_weights, (str, os.PathLike)):
            self._backbone_weights = os.fspath(backbone_weights)
            if not any(p.is_meta for p in self.backbone.parameters()):
                self.load_backbone_weights()
        self.lora_modules = apply_lora(self.backbone, **dict(lora)) if lora else []
        if fused:
            self.backbone.fuse()
        self.freeze_policy = freeze
        self.freeze(freeze)

    # ------------------------------------------------------------------------------------ building
    @staticmethod
    def _build_backbone(backbone, weights) -> Backbone:
        if isinstance(weights, Backbone):
            backbone = weights
        if isinstance(backbone, Encoder):
            backbone = backbone.backbone
        if isinstance(backbone, Backbone):
            return backbone
        if isinstance(backbone, (str, BackboneConfig)):
            return Backbone(backbone)
        raise TypeError(f"backbone must be a preset name, BackboneConfig, Backbone or Encoder; got {type(backbone).__name__}")

    def _build_tokenizer(self, key: str, spec, dim: int) -> nn.Module:
        self.modality_names[key] = None
        if isinstance(spec, nn.Module):
            tok = spec
        elif isinstance(spec, str):
            tok = get_modality(spec).create(dim)
            self.modality_names[key] = spec
        elif isinstance(spec, Mapping):
            cfg = dict(spec)
            name = cfg.pop("name", key)
            tok = get_modality(name).create(dim, **cfg)
            self.modality_names[key] = name
        else:
            raise TypeError(f"tokenizer for {key!r} must be a registry name, a config dict or an nn.Module; got {type(spec).__name__}")
        if getattr(tok, "dim", dim) != dim:
            raise ValueError(f"tokenizer {key!r} has dim {tok.dim} but the backbone's hidden size is {dim}")
        return tok

    def _build_head(self, name: str, spec, dim: int) -> Head:
        if name == "loss":
            raise ValueError("a head may not be named 'loss' (the total loss's key)")
        if isinstance(spec, nn.Module):
            head, inputs, target, weight = spec, getattr(spec, "inputs", None) or None, getattr(spec, "target", "label"), 1.0
        elif isinstance(spec, Mapping):
            cfg = dict(spec)
            if "name" not in cfg:
                ins = _as_list(cfg.get("inputs")) or list(self.tokenizers)
                reg = self.modality_names.get(ins[0]) if len(ins) == 1 else None
                if reg is None:
                    raise ValueError(f"head {name!r} needs a 'name' (one of {heads_mod.list_heads()}); got {spec!r}")
                cfg = {**get_modality(reg).default_head, **cfg}  # the modality's default head
            kind = cfg.pop("name")
            inputs, weight = _as_list(cfg.pop("inputs", None)), float(cfg.pop("weight", 1.0))
            has_target = "target" in cfg
            target = cfg.pop("target", None)
            cls = heads_mod.get_head(kind)
            if getattr(cls, "multi_input", False):
                cfg.setdefault("modalities", inputs or list(self.tokenizers))
                inputs = list(cfg["modalities"])
            head = heads_mod.create(kind, dim, **cfg)
            if not has_target:
                target = head.default_target
        else:
            raise TypeError(f"head {name!r} must be a config dict or an nn.Module; got {type(spec).__name__}")
        inputs = inputs or list(self.tokenizers)
        unknown = [m for m in inputs if m not in self.tokenizers]
        if unknown:
            raise ValueError(f"head {name!r} reads {unknown}, which are not among the tokenizers {list(self.tokenizers)}")
        if self.fusion == "separate" and not getattr(head, "multi_input", False) and len(inputs) != 1:
            raise ValueError(f"with fusion='separate' head {name!r} must read one modality; got inputs {inputs}")
        head.inputs, head.target, head.loss_weight = inputs, target, weight
        return head

    def load_backbone_weights(self, path: str | os.PathLike | None = None) -> None:
        """Load backbone weights (mmte or Meta-Transformer-release keys) strictly, LoRA adapters aside."""
        path = path or self._backbone_weights
        if path is None:
            raise ValueError("no backbone_weights path was given")
        n = load_backbone_state(self.backbone, load_state_dict_file(path), source=os.fspath(path))
        logger.info("loaded %d backbone tensors from %s", n, path)

    # ---------------------------------------------------------------------------- freezing, init
    def freeze(self, policy: str | Sequence[str]) -> list[str]:
        """Apply a freeze policy; returns the names of the trainable parameters."""
        if isinstance(policy, str):
            if policy not in FREEZE_POLICIES:
                raise ValueError(f"freeze must be one of {FREEZE_POLICIES} or a list of globs; got {policy!r}")
            globs = {"backbone": ["backbone.*"], "tokenizers": ["tokenizers.*", "modality_embed.*"], "none": []}[policy]
            keep = ["*.lora.*"] if policy == "backbone" else []
        elif isinstance(policy, Sequence) and all(isinstance(g, str) for g in policy):
            globs, keep = list(policy), []
        else:
            raise ValueError(f"freeze must be one of {FREEZE_POLICIES} or a list of globs; got {policy!r}")
        for n, p in self.named_parameters():
            frozen = any(fnmatch.fnmatch(n, g) for g in globs) and not any(fnmatch.fnmatch(n, g) for g in keep)
            p.requires_grad_(not frozen)
        self.freeze_policy = policy
        names = self.trainable_parameter_names()
        logger.info("freeze=%r: %d/%d parameter tensors trainable", policy, len(names), len(list(self.parameters())))
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
        bs = {m: s.batch_size for m, s in seqs.items()}
        if len(set(bs.values())) != 1:
            raise ValueError(f"joint fusion needs one batch size for all modalities; got {bs}")
        tokens, masks, segments, start = [], [], {}, 0
        for m, s in seqs.items():
            tokens.append(s.tokens + self.modality_embed(m).to(s.tokens.dtype))
            masks.append(s.full_mask())
            segments[m] = (start, start + s.num_tokens)
            start += s.num_tokens
        first = next(iter(seqs.values()))
        mask = None if all(s.mask is None for s in seqs.values()) else torch.cat(masks, 1)
        return TokenSeq(torch.cat(tokens, 1), mask, first.num_prefix_tokens, extras={"segments": segments, "sequences": dict(seqs)})

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
            out = self._touch_unused(out, set(seqs))
        return out

    def inference(self, dtype: str = "auto", compile: bool = False, **kwargs: Any) -> nn.Module:
        """A frozen eval-mode copy for prediction: backbone in bf16 where the CPU has native bf16 (``"auto"``),
        run under ``torch.inference_mode``, optionally compiled. See :func:`mmte.inference.optimize`."""
        from .inference import optimize

        return optimize(self, dtype, compile, **kwargs)

    def _touch_unused(self, out: dict[str, Any], present: set[str]) -> dict[str, Any]:
        unused = [p for m, t in self.tokenizers.items() if m not in present for p in t.parameters() if p.requires_grad]
        unused += [p for n, h in self.heads.items() if n not in out for p in h.parameters() if p.requires_grad]
        if not unused:
            return out
        zero = torch.stack([p.sum() for p in unused]).sum() * 0.0
        name = next(iter(out))
        o = out[name]
        if isinstance(o, torch.Tensor):
            out[name] = o + zero.to(o.dtype)
        elif isinstance(o, dict):
            k = next(k for k, v in o.items() if isinstance(v, torch.Tensor) and v.is_floating_point())
            o = dict(o)
            o[k] = o[k] + zero.to(o[k].dtype)
            out[name] = o
        return out

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
