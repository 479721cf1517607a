"""The parts of :class:`~mmte.model.MetaTransformer`, built from plain data, and how they are joined.

Builders turn a recipe's entries (registry names, config dicts, ready modules) into the backbone,
tokenizers and heads; :class:`ModalityEmbedding` and :func:`join_sequences` make joint fusion's one
sequence; :func:`freeze_parameters` applies a freeze policy; :func:`touch_unused` keeps DDP content
when a batch lacks a modality.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from . import heads as heads_mod
from .encoders import Backbone, BackboneConfig, Encoder
from .heads import Head
from .registry import entry_from_class_path
from .seq import TokenSeq
from .tokenizers.registry import get_modality

logger = logging.getLogger(__name__)

__all__ = [
    "FREEZE_POLICIES",
    "FUSIONS",
    "ModalityEmbedding",
    "build_backbone",
    "build_head",
    "build_tokenizer",
    "freeze_parameters",
    "join_sequences",
    "touch_unused",
]

FUSIONS = ("single", "joint", "separate")
FREEZE_POLICIES = ("backbone", "tokenizers", "none")


def _as_list(x: str | Sequence[str] | None) -> list[str] | None:
    if x is None:
        return None
    return [x] if isinstance(x, str) else list(x)


def build_backbone(backbone: str | BackboneConfig | Backbone | Encoder, weights: Any = None) -> Backbone:
    """The backbone from a preset name, a config, a built backbone or an encoder's (``weights`` a built
    :class:`Backbone` wins)."""
    if isinstance(weights, Backbone):
        backbone = weights
    if isinstance(backbone, Encoder):
        backbone = backbone.backbone
    if isinstance(backbone, Backbone):
        return backbone
    if isinstance(backbone, (str, BackboneConfig)):
        return Backbone(backbone)
    raise TypeError(f"backbone must be a preset name, BackboneConfig, Backbone or Encoder; got {type(backbone).__name__}")


def build_tokenizer(key: str, spec: str | Mapping[str, Any] | nn.Module, dim: int) -> tuple[nn.Module, str | None]:
    """The tokenizer for batch key ``key`` from a registry name, a ``{name: ..., options}`` dict or a module,
    and its registry name (None for a ready module)."""
    registered = None
    if isinstance(spec, nn.Module):
        tok = spec
    elif isinstance(spec, str):
        tok = get_modality(spec).create(dim)
        registered = spec
    elif isinstance(spec, Mapping):
        cfg = dict(entry_from_class_path(spec))  # {class_path, init_args} -> {name: class path, **init_args}
        modality = get_modality(cfg.pop("name", key))
        tok = modality.create(dim, **cfg)
        registered = modality.name
    else:
        raise TypeError(f"tokenizer for {key!r} must be a registry name, a config dict or an nn.Module; got {type(spec).__name__}")
    if getattr(tok, "dim", dim) != dim:
        raise ValueError(f"tokenizer {key!r} has dim {tok.dim} but the backbone's hidden size is {dim}")
    return tok, registered


def build_head(
    name: str, spec: Mapping[str, Any] | Head, dim: int, *, modality_names: Mapping[str, str | None], fusion: str
) -> Head:
    """Head ``name`` from a ``{name: kind, inputs, target, weight, options}`` dict or a module, with its
    ``inputs``, ``target`` and ``loss_weight`` set; ``modality_names`` maps the model's batch keys to their
    registry names (a head without ``name`` is its one modality's default head)."""
    tokenizers = list(modality_names)
    if name == "loss":
        raise ValueError("a head may not be named 'loss' (the total loss's key)")
    if isinstance(spec, nn.Module):
        head, inputs, target, weight = spec, getattr(spec, "inputs", None) or None, getattr(spec, "target", "label"), 1.0
    elif isinstance(spec, Mapping):
        cfg = dict(entry_from_class_path(spec))
        if "name" not in cfg:
            ins = _as_list(cfg.get("inputs")) or tokenizers
            reg = modality_names.get(ins[0]) if len(ins) == 1 else None
            if reg is None:
                raise ValueError(f"head {name!r} needs a 'name' (one of {heads_mod.list_heads()}); got {spec!r}")
            cfg = {**get_modality(reg).default_head, **cfg}  # the modality's default head
        kind = cfg.pop("name")
        inputs, weight = _as_list(cfg.pop("inputs", None)), float(cfg.pop("weight", 1.0))
        has_target = "target" in cfg
        target = cfg.pop("target", None)
        cls = heads_mod.get_head(kind)
        if getattr(cls, "multi_input", False):
            cfg.setdefault("modalities", inputs or tokenizers)
            inputs = list(cfg["modalities"])
        head = heads_mod.create(kind, dim, **cfg)
        if not has_target:
            target = head.default_target
    else:
        raise TypeError(f"head {name!r} must be a config dict or an nn.Module; got {type(spec).__name__}")
    inputs = inputs or tokenizers
    unknown = [m for m in inputs if m not in tokenizers]
    if unknown:
        raise ValueError(f"head {name!r} reads {unknown}, which are not among the tokenizers {tokenizers}")
    if fusion == "separate" and not getattr(head, "multi_input", False) and len(inputs) != 1:
        raise ValueError(f"with fusion='separate' head {name!r} must read one modality; got inputs {inputs}")
    head.inputs, head.target, head.loss_weight = inputs, target, weight
    return head


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


def join_sequences(seqs: Mapping[str, TokenSeq], modality_embed: ModalityEmbedding) -> TokenSeq:
    """Joint fusion: the sequences concatenated in order, each plus its modality-type embedding, masks
    concatenated; ``extras["segments"]`` = ``{modality: (start, end)}``, ``extras["sequences"]`` the inputs."""
    bs = {m: s.batch_size for m, s in seqs.items()}
    if len(set(bs.values())) != 1:
        raise ValueError(f"joint fusion needs one batch size for all modalities; got {bs}")
    tokens, masks, segments, start = [], [], {}, 0
    for m, s in seqs.items():
        tokens.append(s.tokens + modality_embed(m).to(s.tokens.dtype))
        masks.append(s.full_mask())
        segments[m] = (start, start + s.num_tokens)
        start += s.num_tokens
    first = next(iter(seqs.values()))
    mask = None if all(s.mask is None for s in seqs.values()) else torch.cat(masks, 1)
    return TokenSeq(torch.cat(tokens, 1), mask, first.num_prefix_tokens, extras={"segments": segments, "sequences": dict(seqs)})


def freeze_parameters(model: nn.Module, policy: str | Sequence[str]) -> list[str]:
    """Apply a freeze policy to ``model``'s parameters (``requires_grad``); returns the trainable ones' names.

    ``"backbone"`` (LoRA adapters stay trainable), ``"tokenizers"`` (and modality embeddings), ``"none"``,
    or a list of globs over parameter names.
    """
    if isinstance(policy, str):
        if policy not in FREEZE_POLICIES:
            raise ValueError(f"freeze must be one of {FREEZE_POLICIES} or a list of globs; got {policy!r}")
        globs = {"backbone": ["backbone.*"], "tokenizers": ["tokenizers.*", "modality_embed.*"], "none": []}[policy]
        keep = ["*.lora.*"] if policy == "backbone" else []
    elif isinstance(policy, Sequence) and all(isinstance(g, str) for g in policy):
        globs, keep = list(policy), []
    else:
        raise ValueError(f"freeze must be one of {FREEZE_POLICIES} or a list of globs; got {policy!r}")
    for n, p in model.named_parameters():
        frozen = any(fnmatch.fnmatch(n, g) for g in globs) and not any(fnmatch.fnmatch(n, g) for g in keep)
        p.requires_grad_(not frozen)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    logger.info("freeze=%r: %d/%d parameter tensors trainable", policy, len(names), len(list(model.parameters())))
    return names


def touch_unused(model: nn.Module, out: dict[str, Any], present: set[str]) -> dict[str, Any]:
    """Add ``0 * sum(trainable parameters that got no input)`` (tokenizers of absent modalities, heads
    that did not run) to the first output, so plain DDP sees a gradient for every parameter."""
    unused = [p for m, t in model.tokenizers.items() if m not in present for p in t.parameters() if p.requires_grad]
    unused += [p for n, h in model.heads.items() if n not in out for p in h.parameters() if p.requires_grad]
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
