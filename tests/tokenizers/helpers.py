"""Shared helpers for the modality tests: build a tiny model around any registered modality."""

from __future__ import annotations

import torch

import mmte
from mmte.tokenizers.registry import get_modality

# Required arguments of the default heads (the registry's default_head gives the rest).
HEAD_REQUIRED = {"classification": {"num_classes": 5}, "regression": {}, "forecasting": {"horizon": 8}, "token": {"num_classes": 3}}


def head_spec(modality: str) -> dict:
    spec = dict(get_modality(modality).default_head)
    for k, v in HEAD_REQUIRED.get(spec["name"], {}).items():
        spec.setdefault(k, v)
    return spec


def tiny_model(modality: str, freeze="backbone", device=None, **kw) -> mmte.MetaTransformer:
    spec = get_modality(modality)
    return mmte.MetaTransformer(
        {modality: {"name": modality, **spec.example_config}},
        "tiny",
        {"h": head_spec(modality)},
        freeze=freeze,
        device=device,
        **kw,
    )


def example_batch(modality: str, size: int, n: int = 2, seed0: int = 0):
    spec = get_modality(modality)
    return spec.collate_fn([spec.example(size, seed0 + i) for i in range(n)])


def call_tokenizer(tok, value):
    return tok(**value) if isinstance(value, dict) else tok(value)


def pooled(model: mmte.MetaTransformer, modality: str, value) -> torch.Tensor:
    """Tokenizer -> backbone -> masked mean pooling (prefix excluded): [B, D]."""
    seqs = model.forward_tokens({modality: value})
    hidden, seq = model.forward_backbone(seqs)[modality]
    return mmte.heads.masked_pool(hidden, seq.mask, "mean", seq.num_prefix_tokens)
