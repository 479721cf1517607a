"""Metrics of :class:`~mmte.training.module.MMTEModule`'s heads, from torchmetrics.

Classification and token heads: accuracy; regression and forecasting heads: MSE and MAE;
contrastive heads: recall@1 in both directions over the whole evaluation epoch (:class:`RecallAtOne`,
equal to torchmetrics' ``RetrievalHitRate(top_k=1)`` over every query of the epoch; kept as its own
metric because the ranking needs the epoch's embeddings, not per-batch scores).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torchmetrics

__all__ = ["PRIMARY", "RecallAtOne", "batch_size", "head_metrics"]


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


def head_metrics(kind: str, head_cfg: Mapping[str, Any]) -> dict[str, torchmetrics.Metric]:
    """The metrics of a head of family ``kind`` (``{name: metric}``; empty for unknown families)."""
    if kind == "classification":
        return {"acc": torchmetrics.classification.MulticlassAccuracy(int(head_cfg["num_classes"]), average="micro")}
    if kind in ("regression", "forecasting"):
        return {"mse": torchmetrics.MeanSquaredError(), "mae": torchmetrics.MeanAbsoluteError()}
    if kind == "contrastive":
        return {"r1": RecallAtOne()}
    if kind == "token":
        return {"acc": torchmetrics.classification.MulticlassAccuracy(int(head_cfg["num_classes"]), average="micro", ignore_index=head_cfg.get("ignore_index", -100))}
    return {}


#: the metric each head's family is monitored by, and its direction
PRIMARY = {"acc": "max", "r1": "max", "mse": "min"}


def batch_size(batch: Mapping[str, Any]) -> int | None:
    """The batch's sample count (the first dim of its first tensor), which logged values are weighted by."""
    for v in batch.values():
        if isinstance(v, torch.Tensor) and v.dim() > 0:
            return int(v.shape[0])
        if isinstance(v, Mapping):
            for t in v.values():
                if isinstance(t, torch.Tensor) and t.dim() > 0:
                    return int(t.shape[0])
    return None
