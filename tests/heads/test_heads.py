"""Heads against naive references."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mmte import heads
from mmte.heads import masked_pool
from mmte.tokenizers import TokenSeq
from mmte.tokenizers.time_series import TimeSeriesTokenizer


def naive_pool(h, mask, pool, prefix):
    out = []
    for b in range(h.shape[0]):
        if pool == "cls":
            out.append(h[b, 0])
            continue
        rows = [h[b, i] for i in range(prefix, h.shape[1]) if mask is None or bool(mask[b, i])]
        st = torch.stack(rows)
        out.append(st.mean(0) if pool == "mean" else st.max(0).values)
    return torch.stack(out)


@pytest.mark.parametrize("pool", ["cls", "mean", "max"])
@pytest.mark.parametrize("prefix", [0, 1])
def test_masked_pool_matches_loop(pool, prefix):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 7, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0, 0], [1, 0, 1, 1, 0, 1, 0]], dtype=torch.bool)
    torch.testing.assert_close(masked_pool(h, mask, pool, prefix), naive_pool(h, mask, pool, prefix))
    torch.testing.assert_close(masked_pool(h, None, pool, prefix), naive_pool(h, None, pool, prefix))


def test_masked_pool_rejects_empty_and_bad_name():
    with pytest.raises(ValueError, match="at least one real"):
        masked_pool(torch.randn(1, 3, 2), torch.tensor([[True, False, False]]), "mean", 1)
    for mask in (None, torch.ones(2, 0, dtype=torch.bool)):  # no tokens at all: an error, not a NaN
        with pytest.raises(ValueError, match=r"at least one token; got hidden states of shape \(2, 0, 4\)"):
            masked_pool(torch.randn(2, 0, 4), mask, "mean")
    with pytest.raises(ValueError, match=r"pool must be one of \('cls', 'mean', 'max'\); got 'avg'"):
        masked_pool(torch.randn(1, 3, 2), None, "avg")


def naive_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over rows of ``log(sum_j exp(z_j)) - z_y``, in float64, written out (no torch loss function)."""
    z = logits.double()
    rows = torch.arange(z.shape[0])
    return (z.exp().sum(-1).log() - z[rows, target]).mean().to(logits.dtype)


def test_naive_cross_entropy_known_value():
    # two classes with logits (0, log 3): p = (1/4, 3/4); target 0 -> log 4, target 1 -> log(4/3)
    z = torch.tensor([[0.0, float(torch.tensor(3.0).log())]])
    torch.testing.assert_close(naive_cross_entropy(z, torch.tensor([0])), torch.tensor(4.0).log())
    torch.testing.assert_close(naive_cross_entropy(z, torch.tensor([1])), torch.tensor(4.0 / 3.0).log())


def test_classification_head_and_loss():
    head = heads.create("classification", dim=8, num_classes=4, pool="mean", hidden=16)
    h = torch.randn(5, 6, 8)
    seq = TokenSeq(h, None, 1)
    out = head(h, seq)
    assert out.shape == (5, 4)
    y = torch.tensor([0, 1, 2, 3, 0])
    torch.testing.assert_close(head.loss(out, y), naive_cross_entropy(out, y))
    smoothed = heads.create("classification", dim=8, num_classes=4, label_smoothing=0.2)
    out = smoothed(h, seq)
    # label smoothing: (1 - eps) * NLL + eps * mean over classes of -log p
    logp = out.double() - out.double().exp().sum(-1, keepdim=True).log()
    ref = (0.8 * -logp[torch.arange(5), y] + 0.2 * -logp.mean(-1)).mean()
    torch.testing.assert_close(smoothed.loss(out, y), ref.float())
    with pytest.raises(ValueError, match=r"class ids \[B=5\]"):
        head.loss(out, torch.zeros(5, 4))


def naive_info_nce(a, b, scale):
    """Loop form of CLIP's symmetric loss."""
    n = a.shape[0]
    tot = 0.0
    for i in range(n):
        row = torch.stack([scale * (a[i] * b[j]).sum() for j in range(n)])
        col = torch.stack([scale * (a[j] * b[i]).sum() for j in range(n)])
        tot = tot - torch.log_softmax(row, 0)[i] - torch.log_softmax(col, 0)[i]
    return tot / (2 * n)


def test_contrastive_head_info_nce():
    head = heads.create("contrastive", dim=8, embed_dim=6, modalities=["image", "text"])
    assert math.isclose(head.logit_scale.item(), 1 / 0.07, rel_tol=1e-5)
    hi, ht = torch.randn(4, 5, 8), torch.randn(4, 3, 8)
    out = head({"image": (hi, TokenSeq(hi, None, 1)), "text": (ht, TokenSeq(ht, None, 0))})
    for m in ("image", "text"):
        torch.testing.assert_close(out[m].norm(dim=-1), torch.ones(4))
    torch.testing.assert_close(out["logits"], out["logit_scale"] * out["image"] @ out["text"].t())
    loss = head.loss(out)
    torch.testing.assert_close(loss, naive_info_nce(out["image"], out["text"], out["logit_scale"]))
    loss.backward()
    assert head.log_logit_scale.grad is not None and head.log_logit_scale.grad != 0
    with torch.no_grad():
        head.log_logit_scale.fill_(10.0)
    assert math.isclose(head.logit_scale.item(), 100.0, rel_tol=1e-5)  # clamped like CLIP
    with pytest.raises(ValueError, match="two distinct modalities"):
        heads.create("contrastive", dim=8, modalities=["a"])


def test_forecasting_head_undoes_revin():
    tok = TimeSeriesTokenizer(16, patch_len=8, stride=4, num_channels=2)
    with torch.no_grad():
        tok.revin.weight.fill_(2.0)
        tok.revin.bias.fill_(0.5)
    x = torch.randn(3, 32, 2) * 4 + 10
    seq = tok(x)
    head = heads.create("forecasting", dim=16, horizon=5, num_patches=seq.num_tokens)
    with torch.no_grad():  # a head that predicts 0 in normalised (affine) units ...
        head.proj.weight.zero_()
        head.proj.bias.fill_(0.5)
    y = head(torch.zeros_like(seq.tokens), seq)
    assert y.shape == (3, 5, 2)
    # ... forecasts each series' own mean: the affine bias 0.5 maps back to 0, then * std + mean
    torch.testing.assert_close(y, x.mean(1, keepdim=True).expand(-1, 5, -1), rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="num_patches=7"):
        heads.create("forecasting", dim=16, horizon=5, num_patches=7)(seq.tokens, seq)


def test_token_head_ignores_padding():
    head = heads.create("token", dim=8, num_classes=3)
    h = torch.randn(2, 5, 8)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    out = head(h, TokenSeq(h, mask, 1))
    assert out.shape == (2, 4, 3) and out[1, 2:].abs().sum() == 0
    target = torch.tensor([[0, 1, 2, 1], [2, 0, -100, -100]])
    ref = naive_cross_entropy(torch.cat([out[0], out[1, :2]]), torch.tensor([0, 1, 2, 1, 2, 0]))  # the -100 (padding) targets left out
    torch.testing.assert_close(head.loss(out, target), ref)


def test_regression_losses():
    head = heads.create("regression", dim=8, out_dim=2, loss_type="l1")
    h = torch.randn(4, 3, 8)
    out = head(h, None)
    t = torch.randn(4, 2)
    torch.testing.assert_close(head.loss(out, t), (out - t).abs().mean())


def test_head_registry():
    assert {"classification", "regression", "forecasting", "token", "contrastive"} <= set(heads.list_heads())
    with pytest.raises(ValueError, match=r"^unknown head 'segmentation', expected one of classification, contrastive, forecasting, regression, token, set the head's name: "
                       r"to one of them \(new heads: see docs/extending.md\)$"):
        heads.create("segmentation", dim=8)

    @heads.register_head("_test_linear")
    class LinearHead(heads.Head):
        def __init__(self, dim, out=1):
            super().__init__(dim)
            self.fc = torch.nn.Linear(dim, out)

        def forward(self, hidden, seq=None):
            return self.fc(hidden[:, 0])

        def loss(self, output, target):
            return F.mse_loss(output, target)

    try:
        assert isinstance(heads.create("_test_linear", dim=4, out=2), LinearHead)
    finally:
        heads.HEADS.unregister("_test_linear")
