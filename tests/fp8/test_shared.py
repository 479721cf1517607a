"""A shared backbone run once per modality in one step under delayed scaling.

TransformerEngine records one amax per module per step and forbids a second call in one autocast
region; mmte folds every call into the pending amax. Here one ``Backbone`` serves two views of the
sklearn digits — 4x4 image patches (ImageTokenizer) and the 8 pixel rows as tokens, scaled up 8x so the
two passes have different magnitudes — and the test checks (1) each linear's amax history holds the max
over both passes, forward and backward, and (2) the model trains like its fp32 twin.
"""

import pytest
import torch
import torch.nn.functional as F

from mmte import fp8
from mmte.encoders import Backbone
from mmte.tokenizers.image import ImageTokenizer

RECIPE = fp8.DelayedScaling(amax_history_len=8)
STEPS = 150


class TwoModalityNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.image = ImageTokenizer(64, img_size=8, patch_size=4, in_chans=1)
        self.rows = torch.nn.Linear(8, 64)  # each pixel row of the digit is one token
        self.row_pos = torch.nn.Parameter(torch.randn(1, 8, 64) * 0.02)
        self.backbone = Backbone("tiny")
        self.head_image = torch.nn.Linear(64, 10)
        self.head_rows = torch.nn.Linear(64, 10)

    def forward(self, images):
        a = self.backbone(self.image(images).tokens)
        b = self.backbone(self.rows(images[:, 0] * 8.0) + self.row_pos)
        return self.head_image(a.mean(1)), self.head_rows(b.mean(1))


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0
    return x, torch.tensor(d.target)


def test_amax_history_sees_both_passes(digits):
    x, y = digits
    torch.manual_seed(0)
    model = fp8.convert(TwoModalityNet(), RECIPE)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, fp8.FP8Linear)}
    assert len(linears) == 8
    seen_in = {n: [] for n in linears}
    seen_grad = {n: [] for n in linears}

    def fwd_hook(name):
        def hook(mod, args, out):
            seen_in[name].append(args[0].detach().abs().max().item())
            out.register_hook(lambda g: seen_grad[name].append(g.abs().max().item()))

        return hook

    handles = [m.register_forward_hook(fwd_hook(n)) for n, m in linears.items()]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(3):
        for v in seen_in.values():
            v.clear()
        for v in seen_grad.values():
            v.clear()
        idx = torch.arange(step * 64, (step + 1) * 64)
        with fp8.autocast(recipe=RECIPE):
            la, lb = model(x[idx])
            loss = F.cross_entropy(la, y[idx]) + F.cross_entropy(lb, y[idx])
        loss.backward()
        opt.step()
        opt.zero_grad()
        fp8.update_scales()
        differs = 0
        for n, m in linears.items():
            assert len(seen_in[n]) == 2 and len(seen_grad[n]) == 2  # two passes per step
            want_in, want_grad = max(seen_in[n]), max(seen_grad[n])
            assert m.fp8_amax_history[0, 0].item() == pytest.approx(want_in, rel=1e-6), n
            assert m.fp8_amax_history[2, 0].item() == pytest.approx(want_grad, rel=1e-6), n
            assert m.fp8_scale[0].item() == pytest.approx(448.0 / m.fp8_amax_history[0].max().item(), rel=1e-6)
            differs += abs(seen_in[n][0] - seen_in[n][1]) > 0.05 * want_in
        assert differs >= 4  # the passes really differ: recording only one of them would be wrong
        assert all(m.fp8_amax_history[0, step + 1 :].eq(0).all() for m in linears.values())  # one entry per step
    for h in handles:
        h.remove()


def test_shared_backbone_trains_like_fp32(digits):
    x, y = digits
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    tr, te = perm[:1400], perm[1400:]
    results = {}
    for name, recipe in (("fp32", None), ("delayed", RECIPE)):
        torch.manual_seed(0)
        model = TwoModalityNet()
        if recipe is not None:
            fp8.convert(model, recipe)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 - s / STEPS)
        g = torch.Generator().manual_seed(1)
        for _ in range(STEPS):
            idx = tr[torch.randint(0, len(tr), (64,), generator=g)]
            with fp8.autocast(recipe=recipe, enabled=recipe is not None):
                la, lb = model(x[idx])
                loss = F.cross_entropy(la, y[idx]) + F.cross_entropy(lb, y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        with torch.no_grad(), fp8.autocast(recipe=recipe, enabled=recipe is not None):
            la, lb = model(x[tr])
            final = (F.cross_entropy(la, y[tr]) + F.cross_entropy(lb, y[tr])).item()
            ta, tb = model(x[te])
            acc = ((ta.argmax(-1) == y[te]).float().mean().item(), (tb.argmax(-1) == y[te]).float().mean().item())
        results[name] = (final, acc)
    (l32, a32), (l8, a8) = results["fp32"], results["delayed"]
    print(f"\nshared backbone: fp32 loss {l32:.4f} acc {a32}, delayed FP8 loss {l8:.4f} acc {a8}")
    assert l32 < 0.8 and min(a32) > 0.8
    assert abs(l8 - l32) / l32 < 0.05
    assert abs(a8[0] - a32[0]) < 0.02 and abs(a8[1] - a32[1]) < 0.02
