"""The optimiser and learning-rate schedule of :class:`~mmte.training.module.MMTEModule`.

AdamW over the trainable parameters only, no weight decay on norms, biases, embeddings
(position/cls/modality/register tokens) and other 1-d parameters, optional layer-wise learning-rate
decay (the last backbone layer gets ``lr``, layer ``i`` of ``L`` ``lr * decay**(L - 1 - i)``,
tokenizers ``lr * decay**L``, heads ``lr``), and a per-step schedule: linear warm-up then cosine
decay to ``min_lr_ratio`` times each group's peak.

The schedule is torch's ``LambdaLR`` with the closed-form multiplier :func:`warmup_cosine`. torch's
``SequentialLR(LinearLR, CosineAnnealingLR)`` gives the same values for a single group, but
``CosineAnnealingLR`` takes one absolute ``eta_min`` for every group, so groups with their own peaks
(layer decay, LoRA's ``lr_scale``) would all end at the same learning rate instead of at
``min_lr_ratio`` of theirs; it also stores ``T_max`` in its state, so a resumed run with more steps
would keep the old horizon. ``LambdaLR``'s state (the step count) is what Lightning saves and restores.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["NO_DECAY", "adamw_warmup_cosine", "param_group_spec", "param_groups", "warmup_cosine", "warmup_steps"]

#: parameter-name pieces that mark embeddings and norms (no weight decay)
NO_DECAY = ("pos_embed", "cls_token", "cls_pos", "reg_token", "modality_embed", "embedding", "embed.weight", "norm")

GroupSpec = list[tuple[tuple[bool, float], list[tuple[str, nn.Parameter]]]]


def param_group_spec(model: nn.Module, num_layers: int, layer_decay: float | None = None) -> GroupSpec:
    """The optimizer's parameter groups over ``model``'s trainable parameters: ``((no_decay, lr
    scale), [(fqn, parameter)])`` in a fixed order (decayed first, then by falling lr scale). A module
    with an ``lr_scale`` attribute (LoRA adapters) multiplies the scale of its own parameters.

    Args:
        model: a :class:`~mmte.model.MetaTransformer` or a pipeline stage's part of one.
        num_layers: the whole backbone's layer count (a stage may hold fewer).
        layer_decay: layer-wise learning-rate decay in (0, 1], or None.
    """
    groups: dict[tuple[bool, float], list[tuple[str, nn.Parameter]]] = {}
    # a module's own learning-rate multiplier (LoRA adapters' lr_scale), by the prefix of its parameters
    own = {n: float(m.lr_scale) for n, m in model.named_modules() if isinstance(getattr(m, "lr_scale", None), (int, float))}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        no_decay = p.ndim <= 1 or any(s in name for s in NO_DECAY)
        scale = 1.0
        if layer_decay is not None and layer_decay < 1.0:
            depth = num_layers  # heads and anything after the backbone
            if name.startswith("backbone.layers."):
                depth = int(name.split(".")[2])
            elif name.startswith(("tokenizers.", "modality_embed.", "backbone.norm_pre")):
                depth = -1
            scale = layer_decay ** (num_layers - 1 - depth) if depth < num_layers else 1.0
        scale *= own.get(name.rpartition(".")[0], 1.0)
        groups.setdefault((no_decay, scale), []).append((name, p))
    return sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][1]))


def param_groups(spec: GroupSpec, lr: float, weight_decay: float) -> list[dict[str, Any]]:
    """``torch.optim`` parameter groups from :func:`param_group_spec` (``lr_scale`` kept for schedulers)."""
    return [
        {"params": [p for _, p in ps], "weight_decay": 0.0 if nd else weight_decay, "lr": lr * s, "lr_scale": s}
        for (nd, s), ps in spec
    ]


def warmup_cosine(step: int, warmup: int, total: int, floor: float) -> float:
    """Learning-rate multiplier at ``step`` (0-based): linear ``1/warmup .. 1`` over the first ``warmup``
    steps, then cosine from 1 to ``floor`` at ``total``, and ``floor`` after it."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_steps(warmup: float, total: int) -> int:
    """``warmup`` as steps: a float below 1 is a fraction of ``total``, anything else a step count."""
    return round(warmup * total) if isinstance(warmup, float) and warmup < 1 else int(warmup)


def adamw_warmup_cosine(
    groups: list[dict[str, Any]], lr: float, betas: Sequence[float], weight_decay: float, warmup: float, total: int, min_lr_ratio: float
) -> dict[str, Any]:
    """AdamW over ``groups`` with :func:`warmup_cosine` stepped per optimiser step, as Lightning's
    ``configure_optimizers`` returns it."""
    opt = torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), weight_decay=weight_decay)
    warm = warmup_steps(warmup, total)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, functools.partial(warmup_cosine, warmup=warm, total=total, floor=min_lr_ratio))
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "name": "lr"}}
