"""Pretrained weights into a backbone: key normalisation and strict loading on any layout.

A weights file may hold mmte backbone keys under a prefix (a Lightning checkpoint's ``model.backbone.``,
DDP's ``module.``...) or the Meta-Transformer release's keys; :func:`normalize_backbone_keys` turns
either into mmte's, and :func:`load_backbone_state` copies them into a backbone that may be whole, a
pipeline stage's part, or sharded (DTensor parameters under TP/FSDP).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .backbone import Backbone
from .convert import meta_transformer_to_mmte

__all__ = ["load_backbone_state", "normalize_backbone_keys"]


_PREFIXES = ("model.backbone.", "backbone.", "module.", "encoder.", "blocks.")


def _adapter_or_state(key: str) -> bool:
    """Keys a pretrained file does not carry: LoRA adapters and FP8 scaling state."""
    return ".lora." in key or key.rsplit(".", 1)[-1].startswith("fp8_")


def normalize_backbone_keys(sd: Mapping[str, torch.Tensor], num_attention_heads: int) -> dict[str, torch.Tensor]:
    """mmte backbone keys from a file's keys: a common prefix (``model.backbone.``, ``backbone.``,
    ``module.``, ``encoder.``, ``blocks.``) is dropped and Meta-Transformer release keys
    (``0.attn.qkv.weight``...) are converted."""
    sd = dict(sd)
    for prefix in _PREFIXES:
        if sd and all(k.startswith(prefix) for k in sd):
            sd = {k[len(prefix) :]: v for k, v in sd.items()}
    if any(k.startswith("0.attn.") for k in sd):
        sd = meta_transformer_to_mmte(sd, num_attention_heads)
    return sd


def load_backbone_state(backbone: Backbone, sd: Mapping[str, torch.Tensor], source: str = "the file") -> int:
    """Load pretrained weights into ``backbone`` strictly, whatever its layout.

    ``backbone`` may be whole or a pipeline stage's part of one, with plain or DTensor (TP/FSDP)
    parameters; each rank copies its slices out of the full tensors. Keys are normalised first
    (:func:`normalize_backbone_keys`). LoRA adapters and FP8 scaling state are not expected in the file.

    Returns:
        the number of tensors loaded.

    Raises:
        ValueError: missing or unexpected keys, or shapes that differ, listing them.
    """
    from ..parallel.materialize import copy_full  # on use: importing the encoders does not load mmte.parallel

    sd = normalize_backbone_keys(sd, backbone.config.num_attention_heads)
    with torch.device("meta"):
        full = {k: v for k, v in Backbone(backbone.config).state_dict().items() if not _adapter_or_state(k)}
    own = {k: v for k, v in backbone.state_dict(keep_vars=True).items() if not _adapter_or_state(k)}
    missing, unexpected = sorted(set(own) - set(sd)), sorted(set(sd) - set(full))
    shapes = [f"{k}: expected {tuple(full[k].shape)}, got {tuple(sd[k].shape)}" for k in sd if k in full and full[k].shape != sd[k].shape]
    if missing or unexpected or shapes:
        raise ValueError(
            f"backbone weights {source} do not fit the {backbone.config.num_layers}x{backbone.config.hidden_size} backbone: "
            f"missing {missing[:8]}{' ...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}, "
            f"shapes {shapes[:8]}"
        )
    for k, t in own.items():
        copy_full(t, sd[k].to(device=t.device if t.device.type != "meta" else "cpu"))
    return len(own)
