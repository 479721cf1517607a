"""Training on real data (sklearn digits): every FP8 recipe ends where fp32 ends.

An ImageTokenizer (patch 4 on the 8x8 digits: 4 patches + cls) feeds ``Backbone("tiny")`` (2 layers,
width 64, FFN 128: every GEMM dimension a multiple of 16) and a linear head. The same seeds, batches
and 120 AdamW steps (linear decay) run in fp32 and under each recipe with the backbone's 8 linears
converted; the final training-set loss must be within 5% and held-out accuracy within 2 points of fp32.
"""

import pytest
import torch
import torch.nn.functional as F

from mmte import fp8
from mmte.encoders import Backbone
from mmte.tokenizers.image import ImageTokenizer

STEPS, BATCH, LR = 120, 64, 3e-3
RECIPES = {
    "delayed": fp8.DelayedScaling(amax_history_len=16),
    "current": fp8.CurrentScaling(),
    "block": fp8.BlockScaling(),
    "mx": fp8.MXFP8(),
}


class DigitsNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tokenizer = ImageTokenizer(64, img_size=8, patch_size=4, in_chans=1)
        self.backbone = Backbone("tiny")
        self.head = torch.nn.Linear(64, 10)

    def forward(self, images):
        seq = self.tokenizer(images)
        return self.head(self.backbone(seq.tokens, seq.mask).mean(1))


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0
    y = torch.tensor(d.target)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    return x, y, perm[:1400], perm[1400:]


def _train(digits, recipe):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # module-scoped fixtures run outside the one-thread fixture
    try:
        return _train_impl(digits, recipe)
    finally:
        torch.set_num_threads(threads)


def _train_impl(digits, recipe):
    x, y, tr, te = digits
    torch.manual_seed(0)
    model = DigitsNet()
    if recipe is not None:
        fp8.convert(model, recipe)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 - s / STEPS)
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        idx = tr[torch.randint(0, len(tr), (BATCH,), generator=g)]
        with fp8.autocast(recipe=recipe, enabled=recipe is not None):
            loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    with torch.no_grad(), fp8.autocast(recipe=recipe, enabled=recipe is not None):
        final_loss = F.cross_entropy(model(x[tr]), y[tr]).item()
        acc = (model(x[te]).argmax(-1) == y[te]).float().mean().item()
    return final_loss, acc, model


@pytest.fixture(scope="module")
def fp32_result(digits):
    loss, acc, _ = _train(digits, None)
    return loss, acc


@pytest.mark.parametrize("name", list(RECIPES))
def test_fp8_training_matches_fp32(digits, fp32_result, name):
    loss32, acc32 = fp32_result
    assert loss32 < 0.3 and acc32 > 0.85  # the fp32 run itself learned
    loss8, acc8, model = _train(digits, RECIPES[name])
    print(f"\n{name}: loss {loss8:.4f} (fp32 {loss32:.4f}), acc {acc8:.4f} (fp32 {acc32:.4f})")
    assert abs(loss8 - loss32) / loss32 < 0.05
    assert abs(acc8 - acc32) < 0.02
    n = sum(isinstance(m, fp8.FP8Linear) for m in model.modules())
    assert n == 8 and not isinstance(model.head, fp8.FP8Linear)
