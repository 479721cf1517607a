"""Collate helpers shared by the modalities: pad variable-length samples and build masks/lengths."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

__all__ = ["collate_batch", "pad_stack", "stack_parts", "stack_same"]


def pad_stack(tensors: Sequence[torch.Tensor], dim: int = 0, value: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack tensors that differ only along ``dim``, padding with ``value``.

    Returns:
        ``(batch [B, ...], lengths [B] long)`` where ``lengths[i] = tensors[i].shape[dim]``.
    """
    if not tensors:
        raise ValueError("cannot collate an empty list of samples")
    ref = tensors[0]
    for i, t in enumerate(tensors):
        if t.dim() != ref.dim() or any(a != b for j, (a, b) in enumerate(zip(t.shape, ref.shape)) if j != dim % ref.dim()):
            raise ValueError(
                f"sample {i} has shape {tuple(t.shape)}; expected the shape of sample 0 {tuple(ref.shape)} except along dim {dim}"
            )
    n = max(t.shape[dim] for t in tensors)
    out = ref.new_full((len(tensors), *[n if j == dim % ref.dim() else s for j, s in enumerate(ref.shape)]), value)
    for i, t in enumerate(tensors):
        out[i].narrow(dim, 0, t.shape[dim]).copy_(t)
    return out, torch.tensor([t.shape[dim] for t in tensors], dtype=torch.long)


def stack_same(tensors: Sequence[torch.Tensor], what: str) -> torch.Tensor:
    """``torch.stack`` that names the offending sample when shapes differ."""
    if not tensors:
        raise ValueError(f"cannot collate an empty list of {what} samples")
    ref = tuple(tensors[0].shape)
    for i, t in enumerate(tensors):
        if tuple(t.shape) != ref:
            raise ValueError(f"{what} sample {i} has shape {tuple(t.shape)}; expected {ref} like sample 0 (resize or crop first)")
    return torch.stack(list(tensors))


def stack_parts(samples: Sequence[Mapping[str, torch.Tensor]], what: str, item: str = "sample") -> dict[str, torch.Tensor]:
    """Stack samples that are dicts of tensors key by key (every sample must have the same keys)."""
    keys = sorted(samples[0])
    for i, s in enumerate(samples):
        if sorted(s) != keys:
            raise ValueError(f"{what} {item} {i} has parts {sorted(s)}; expected {keys} like {item} 0")
    return {k: stack_same([s[k] for s in samples], f"{what} {k}") for k in keys}


def collate_batch(samples: Sequence[Mapping[str, Any]], collates: Mapping[str, Callable[[list[Any]], Any]] | None = None) -> dict[str, Any]:
    """Collate a list of ``{modality: sample, target_key: value}`` dicts into the model's batch format.

    Keys are collated with ``collates[key]``; keys without one are stacked (tensors) or turned into
    tensors (numbers). Every sample must have the same keys. (The modality registry's collates by
    batch key: :func:`mmte.tokenizers.registry.collate_modalities`.)
    """
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    keys = list(samples[0])
    for i, s in enumerate(samples):
        if list(s) != keys and set(s) != set(keys):
            raise ValueError(f"sample {i} has keys {sorted(s)}; expected {sorted(keys)} like sample 0")
    collates = dict(collates or {})
    out: dict[str, Any] = {}
    for k in keys:
        vals = [s[k] for s in samples]
        fn = collates.get(k)
        if fn is not None:
            out[k] = fn(vals)
        elif isinstance(vals[0], torch.Tensor):
            out[k] = stack_same(vals, k)
        else:
            out[k] = torch.as_tensor(vals)
    return out
