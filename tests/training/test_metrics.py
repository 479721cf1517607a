"""mmte.training.metrics against torchmetrics' own retrieval metric."""

from __future__ import annotations

import torch
import torchmetrics

from mmte.training.metrics import RecallAtOne, batch_size


def _hit_rate(query: torch.Tensor, items: torch.Tensor, relevant: torch.Tensor) -> float:
    """torchmetrics' RetrievalHitRate@1 with every query ranking all items by cosine similarity."""
    n = query.shape[0]
    metric = torchmetrics.retrieval.RetrievalHitRate(top_k=1)
    metric.update((query @ items.t()).reshape(-1), relevant.reshape(-1), indexes=torch.arange(n).repeat_interleave(n))
    return float(metric.compute())


def test_recall_at_one_is_torchmetrics_hit_rate_at_one():
    """Over several batches, with labels (any item of the query's label is a hit) and without (only the pair)."""
    g = torch.Generator().manual_seed(3)
    a = torch.nn.functional.normalize(torch.randn(40, 16, generator=g), dim=-1)
    b = torch.nn.functional.normalize(a + 0.9 * torch.randn(40, 16, generator=g), dim=-1)
    labels = torch.randint(0, 5, (40,), generator=g)
    with_labels, pairs = RecallAtOne(), RecallAtOne()
    for lo, hi in ((0, 7), (7, 25), (25, 40)):
        with_labels.update(a[lo:hi], b[lo:hi], labels[lo:hi])
        pairs.update(a[lo:hi], b[lo:hi])
    r, p = with_labels.compute(), pairs.compute()
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(40, dtype=torch.bool)
    assert abs(float(r["a2b"]) - _hit_rate(a, b, same)) < 1e-7 and abs(float(r["b2a"]) - _hit_rate(b, a, same)) < 1e-7
    assert abs(float(p["a2b"]) - _hit_rate(a, b, eye)) < 1e-7 and abs(float(p["b2a"]) - _hit_rate(b, a, eye)) < 1e-7
    assert 0.0 < float(p["a2b"]) < float(r["a2b"]) < 1.0  # the noise makes some misses; labels forgive some
    assert abs(float(r["mean"]) - (float(r["a2b"]) + float(r["b2a"])) / 2) < 1e-7


def test_batch_size_reads_the_first_tensor():
    assert batch_size({"image": {"pixels": torch.zeros(5, 3)}, "label": torch.zeros(5)}) == 5
    assert batch_size({"n": 3, "label": torch.zeros(7)}) == 7
    assert batch_size({"n": 3}) is None
