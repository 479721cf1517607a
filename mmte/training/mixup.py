"""Mixup (Zhang et al., 2018) for any model whose inputs are float tensors: each training batch is
blended with a shuffled copy of itself, ``x = lam * x + (1 - lam) * x[perm]`` with ``lam ~ Beta(alpha,
alpha)``, and the loss is the same blend of the losses against the two targets (for cross-entropy, exactly
the loss against the blended one-hot labels). Lengths take the longer of the two items, masks their union.

:class:`mmte.training.module.MMTEModule` applies it to its training steps with ``mixup: alpha``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

__all__ = ["draw", "mix_inputs", "mixed_loss"]


def draw(alpha: float, batch_size: int, device: torch.device | str | None = None, group: Any = None) -> tuple[float, torch.Tensor]:
    """``(lam, perm)``: the blend weight ``lam ~ Beta(alpha, alpha)`` folded to ``>= 0.5`` (so the
    unshuffled item dominates and training accuracy stays meaningful) and a random permutation of the batch,
    both from torch's global RNG.

    ``group``: a process group whose ranks hold the same batch (tensor parallel peers); its first rank's draw
    is broadcast to the others, so every shard of the model blends the same items even where the ranks' RNGs
    have drifted apart. None (or a group of one): this process's own draw.
    """
    if not alpha > 0:
        raise ValueError(f"mixup alpha must be > 0; got {alpha!r}")
    a = torch.tensor(float(alpha))
    lam = float(torch.distributions.Beta(a, a).sample())
    lam, perm = max(lam, 1.0 - lam), torch.randperm(batch_size, device=device)
    if group is not None and torch.distributed.get_world_size(group) > 1:
        buf = torch.cat([torch.tensor([lam], dtype=torch.float64, device=perm.device), perm.double()])
        torch.distributed.broadcast(buf, src=torch.distributed.get_global_rank(group, 0), group=group)
        lam, perm = float(buf[0]), buf[1:].long()
    return lam, perm


def _mix(value: Any, lam: float, perm: torch.Tensor, where: str) -> Any:
    if isinstance(value, Mapping):
        return {k: _mix(v, lam, perm, f"{where}.{k}") for k, v in value.items()}
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"mixup: input {where} is a {type(value).__name__}, not a tensor; mixup blends tensor inputs only")
    if value.is_floating_point():
        return value * lam + value[perm] * (1.0 - lam)
    if value.dtype == torch.bool:
        return value | value[perm]
    if value.dim() == 1:  # per-item lengths
        return torch.maximum(value, value[perm])
    raise ValueError(f"mixup: input {where} is an integer tensor of shape {tuple(value.shape)} (token ids?), which cannot be "
                     f"blended; use mixup with modalities whose inputs are float (audio, images, series), or set model.mixup 0")


def mix_inputs(batch: Mapping[str, Any], keys: Sequence[str], lam: float, perm: torch.Tensor) -> dict[str, Any]:
    """``batch`` with the inputs under ``keys`` blended with their ``perm``-shuffled copies (other keys unchanged)."""
    return {**batch, **{k: _mix(batch[k], lam, perm, k) for k in keys if k in batch}}


def mixed_loss(loss: Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, torch.Tensor]], outputs: Mapping[str, Any],
               batch: Mapping[str, Any], targets: Sequence[str], lam: float, perm: torch.Tensor) -> dict[str, torch.Tensor]:
    """``lam * loss(outputs, batch) + (1 - lam) * loss(outputs, batch with targets shuffled by perm)``, per entry."""
    a = loss(outputs, batch)
    b = loss(outputs, {**batch, **{t: batch[t][perm] for t in targets if t in batch}})
    return {k: a[k] * lam + b[k] * (1.0 - lam) for k in a}
