"""The bf16 path of the fused modules (mmte.te.lowp): cached frozen weights and their invalidation,
no redundant casts, GEMMs really in bf16, results close to fp32, the CPU bf16 attention against SDPA
in fp32, and `precision: auto` through `mmte fit` (with the loss curve of bf16 against fp32)."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from mmte import device as mdev
from mmte.encoders import Backbone
from mmte.te import Linear
from mmte.te.attention import cpu_lowp_attention
from mmte.te.lowp import cast_param, clear_cache
from tests.op_log import OpLog

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "recipes" / "quickstart.yaml"
TINY = ROOT / "configs" / "encoders" / "tiny.yaml"
BF16 = torch.bfloat16


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


# ----------------------------------------------------------------------------------- the cache
def test_frozen_weight_cast_is_cached_and_invalidated():
    lin = Linear(64, 32).requires_grad_(False)
    w1 = cast_param(lin.weight, BF16)
    assert w1 is cast_param(lin.weight, BF16)  # cached
    assert torch.equal(w1, lin.weight.detach().to(BF16))
    assert cast_param(lin.weight, torch.float32) is lin.weight  # same dtype: the parameter itself

    new = torch.randn(32, 64)
    lin.load_state_dict({"weight": new, "bias": torch.zeros(32)})  # copy_ bumps the version counter
    w2 = cast_param(lin.weight, BF16)
    assert w2 is not w1 and torch.equal(w2, new.to(BF16))

    with torch.no_grad():
        lin.weight.mul_(2)  # any in-place edit
    assert torch.equal(cast_param(lin.weight, BF16), (2 * new).to(BF16))

    lin.to(torch.float64).to(torch.float32)  # new storage
    w3 = cast_param(lin.weight, BF16)
    assert torch.equal(w3, lin.weight.detach().to(BF16))
    assert clear_cache(lin) == 1 and cast_param(lin.weight, BF16) is not w3


def test_trainable_weight_is_cast_through_autograd_each_call():
    lin = Linear(16, 8)
    x = torch.randn(4, 16, dtype=BF16)
    a, b = cast_param(lin.weight, BF16), cast_param(lin.weight, BF16)
    assert a is not b and a.grad_fn is not None
    lin(x).float().sum().backward()
    assert lin.weight.grad.dtype == torch.float32
    ref = x.float().sum(0).expand(8, 16)  # d(sum(x W^T))/dW = sum over rows of x
    assert torch.allclose(lin.weight.grad, ref, rtol=1e-2, atol=1e-2)  # a bf16 GEMM: 8 significant bits
    with torch.no_grad():  # a trainable weight outside grad mode is cached like a frozen one
        assert cast_param(lin.weight, BF16) is cast_param(lin.weight, BF16)


def test_copy_made_in_inference_mode_serves_a_later_backward():
    lin = Linear(16, 8).requires_grad_(False)
    with torch.inference_mode():
        lin(torch.randn(2, 16, dtype=BF16))
    x = torch.randn(2, 16, dtype=BF16, requires_grad=True)
    lin(x).float().sum().backward()  # would raise if the cached weight were an inference tensor
    assert torch.allclose(x.grad.float(), lin.weight.detach().sum(0).expand(2, 16), atol=2e-2)


# ----------------------------------------------------------------------------- backbone path
def _tiny(**kw) -> Backbone:
    torch.manual_seed(0)
    return Backbone("tiny", **kw)


def test_frozen_backbone_under_autocast_runs_bf16_gemms_without_recasting_weights():
    bb = _tiny().requires_grad_(False)
    x = torch.randn(3, 10, bb.hidden_size, requires_grad=True)  # a trainable tokenizer in front
    with torch.autocast("cpu", dtype=BF16):
        bb(x)  # fills the cache
        with OpLog() as log:
            out = bb(x)
    assert out.dtype == torch.float32
    gemms = [o for o in log.ops if o[0] in ("mm", "addmm", "bmm", "linear", "matmul")]
    assert gemms and all(set(dt) == {BF16} for _, dt, _ in gemms), gemms
    weight_shapes = {tuple(p.shape) for p in bb.parameters() if p.dim() == 2}
    casts = [o for o in log.ops if o[0] in ("_to_copy", "copy_") and o[2][0] in weight_shapes]
    assert casts == []  # no weight was cast again
    n_layernorm = sum(o[0] == "native_layer_norm" for o in log.ops)
    assert n_layernorm == 2 * bb.config.num_layers + (bb.norm is not None)
    assert all(o[1][0] == BF16 for o in log.ops if o[0] == "native_layer_norm")  # bf16 in, fp32 statistics inside


def test_trainable_backbone_casts_each_weight_once_per_step():
    bb = _tiny()
    x = torch.randn(2, 7, bb.hidden_size)
    with torch.autocast("cpu", dtype=BF16), OpLog() as log:
        bb(x)
    weights = [p for p in bb.parameters() if p.dim() == 2]
    casts = [o for o in log.ops if o[0] == "_to_copy" and o[1] == (torch.float32,) and len(o[2][0]) == 2]
    assert len(casts) == len(weights)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"layer_norm_position": "post", "pre_norm": False, "final_norm": False},
        {"normalization": "RMSNorm", "activation": "swiglu", "layer_scale_init": 0.5},
    ],
    ids=["pre-norm", "post-norm", "rmsnorm-swiglu-layerscale"],
)
def test_bf16_path_is_close_to_fp32_forward_and_backward(overrides):
    bb = _tiny(**overrides)
    x = torch.randn(4, 12, bb.hidden_size)
    mask = torch.ones(4, 12, dtype=torch.bool)
    mask[1, 9:] = False
    proj = torch.randn(4, 12, bb.hidden_size)  # a loss whose gradient does not vanish through a final norm
    out32 = bb(x, mask)
    (out32 * proj).mean().backward()
    g32 = {n: p.grad.clone() for n, p in bb.named_parameters()}
    bb.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=BF16):
        out16 = bb(x, mask)
    assert out16.dtype == torch.float32
    (out16 * proj).mean().backward()
    assert rel(out16, out32) < 2e-2
    for n, p in bb.named_parameters():
        assert p.grad.dtype == torch.float32
        assert rel(p.grad, g32[n]) < 6e-2, n


def test_fp8_layers_keep_their_own_precision_under_autocast():
    from mmte.fp8 import convert

    bb = convert(_tiny(hidden_size=64, ffn_hidden_size=128))
    with torch.autocast("cpu", dtype=BF16):
        assert bb.lowp_dtype(torch.randn(1, 4, 64)) is None
    assert _tiny().lowp_dtype(torch.randn(1, 4, 64)) is None  # no autocast, no compute_dtype: as is


# ---------------------------------------------------------------------------------- attention
@pytest.mark.parametrize("case", ["none", "padding", "causal", "padding_causal", "additive"])
def test_cpu_bf16_attention_matches_fp32_sdpa(case):
    torch.manual_seed(1)
    b, h, n, d = 2, 3, 9, 16
    q, k, v = (torch.randn(b, h, n, d) for _ in range(3))
    pad = torch.ones(b, n, dtype=torch.bool)
    pad[0, 6:] = False
    mask = {"none": None, "padding": pad[:, None, None], "causal": None, "padding_causal": pad[:, None, None],
            "additive": torch.randn(b, 1, n, n)}[case]
    causal = "causal" in case
    ref_mask = mask
    if causal:
        tri = torch.ones(n, n, dtype=torch.bool).tril()
        ref_mask = tri if mask is None else mask & tri
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=ref_mask, scale=d**-0.5)
    out = cpu_lowp_attention(q.to(BF16), k.to(BF16), v.to(BF16), mask, causal, d**-0.5)
    assert out.dtype == BF16 and out.shape == ref.shape
    assert (out.float() - ref).abs().max().item() < 3e-2


def test_dot_product_attention_takes_the_bf16_composition_on_cpu():
    from mmte.te import DotProductAttention

    attn = DotProductAttention(2, 8)
    q = torch.randn(4, 64, 2, 8, dtype=BF16)  # 4 x 2 heads x 64 tokens = 512 query rows: the two GEMMs
    with OpLog() as log:
        out = attn(q, q, q)
    names = [o[0] for o in log.ops]
    assert "bmm" in names and "_softmax" in names and not any("scaled_dot_product" in nm for nm in names)
    qf = q.float()
    ref = attn(qf, qf, qf)
    assert (out.float() - ref).abs().max().item() < 3e-2
    with OpLog() as log:
        attn(qf, qf, qf)
    assert any("scaled_dot_product" in o[0] for o in log.ops)  # fp32 keeps SDPA's fused kernel
    small = q[:1, :5]  # 1 x 2 x 5 = 10 rows: SDPA's fused kernel, faster than two tiny GEMMs
    with OpLog() as log:
        out = attn(small, small, small)
    assert any("scaled_dot_product" in o[0] for o in log.ops) and "bmm" not in [o[0] for o in log.ops]
    sf = small.float()
    assert out.dtype == BF16 and (out.float() - attn(sf, sf, sf)).abs().max().item() < 3e-2


# ------------------------------------------------------------------------- precision: auto (CLI)
class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append("mmte: " + record.getMessage())


def _fit(tmp_path: Path, name: str, extra: list[str], capfd) -> tuple[list[float], str]:
    from mmte.cli import main

    log = logging.getLogger("mmte")
    grab = _Lines()
    log.addHandler(grab)  # the CLI's own handler may write to a stream captured by an earlier test
    root = tmp_path / name
    rc = main(["fit", "--config", str(QUICK), "--config", str(TINY), "--trainer.default_root_dir", str(root),
               "--trainer.max_steps", "6", "--trainer.limit_val_batches", "0", "--trainer.log_every_n_steps", "1",
               "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", *extra])
    log.removeHandler(grab)
    assert rc == 0
    capfd.readouterr()
    err = "\n".join(grab.lines)
    (metrics,) = list((root / "logs").glob("version_*/metrics.csv"))
    losses = [float(r["train_loss_step"]) for r in csv.DictReader(metrics.open()) if r.get("train_loss_step")]
    return losses, err


def test_precision_auto_through_mmte_fit(tmp_path, capfd, monkeypatch):
    want, why = mdev.choose_precision("cpu")
    fp32, _ = _fit(tmp_path, "fp32", [], capfd)
    auto, err = _fit(tmp_path, "auto", ["--precision", "auto"], capfd)
    header = [ln for ln in err.splitlines() if ln.startswith("mmte: CPU ") and ", precision " in ln]
    assert header == [f"mmte: {mdev.describe()}, precision {want} (auto: {why})"]
    assert len(auto) == len(fp32) == 6
    # bf16 (here) or fp32 (elsewhere): the short loss curve stays within 3% of fp32 step by step
    for a, b in zip(auto, fp32, strict=True):
        assert abs(a - b) / b < 0.03, (auto, fp32)

    # an AVX2-only CPU: auto never picks bf16
    avx2 = mdev.CPUInfo("AVX2 box", "AVX2", ("avx2", "fma"), 2, 2)
    monkeypatch.setattr(mdev, "cpu_info", lambda path="/proc/cpuinfo": avx2)
    _, err = _fit(tmp_path, "avx2", ["--precision", "auto"], capfd)
    assert "precision 32-true (auto: the CPU has no bf16 units (best: avx2); bf16 would run slower than fp32)" in err


@pytest.mark.slow
def test_quickstart_bf16_loss_curve_within_2_percent_of_fp32_over_100_steps(tmp_path):
    """The issue's check, on 100 steps of the real quickstart (frozen pretrained MiniLM), bf16-mixed (the
    bf16 path) against 32-true, with the noise floor measured in the same test: fp32 again with the
    learning rate moved by one bf16 ulp (x (1 + 2^-8)).

    * the mean loss over the 100 steps and over each half within 2% of fp32 (measured with the recipe's
      one-token tokenizer at lr 1e-3: 0.16%; 0.22% and 0.04%);
    * every 10-step window within 2% of fp32, or, where training is chaotic enough that a one-ulp change of
      the learning rate moves a window further than that, no further than the perturbed fp32 run's furthest
      window (+1%) (measured: bf16 up to 1.6%, the perturbed run up to 0.4%; at lr 3e-3 the same recipe sat
      at the edge of stability and both moved windows by 8-23%).
    ``--trainer.precision`` on the command line selects the precision (the recipe's ``precision: auto``
    used to override it, so both runs were bf16 on this CPU and the comparison was empty).
    """
    from mmte.cli import main

    lr = float(yaml.safe_load(QUICK.read_text())["model"]["lr"])
    curves = {}
    for name, prec, extra in (("fp32", "32-true", []), ("bf16", "bf16-mixed", []), ("fp32_lr_ulp", "32-true", ["--model.lr", str(lr * (1 + 2**-8))])):
        root = tmp_path / name
        assert main(["fit", "--config", str(QUICK), "--trainer.default_root_dir", str(root), "--trainer.precision", prec,
                     "--trainer.max_steps", "100", "--trainer.limit_val_batches", "0", "--trainer.log_every_n_steps", "1",
                     "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", *extra]) == 0
        (metrics,) = list((root / "logs").glob("version_*/metrics.csv"))
        curves[name] = [float(r["train_loss_step"]) for r in csv.DictReader(metrics.open()) if r.get("train_loss_step")]
        assert len(curves[name]) == 100, name
    fp32, bf16, pert = curves["fp32"], curves["bf16"], curves["fp32_lr_ulp"]
    assert bf16 != fp32, "bf16-mixed ran the same numbers as fp32: the precision flag was not applied"

    def rel(a, b, i, n):
        return abs(sum(a[i : i + n]) / sum(b[i : i + n]) - 1)

    assert rel(bf16, fp32, 0, 100) < 0.02, (sum(bf16), sum(fp32))
    assert rel(bf16, fp32, 0, 50) < 0.02 and rel(bf16, fp32, 50, 50) < 0.02, (rel(bf16, fp32, 0, 50), rel(bf16, fp32, 50, 50))
    windows = [(i, rel(bf16, fp32, i, 10), rel(pert, fp32, i, 10)) for i in range(0, 100, 10)]
    floor = max(w[2] for w in windows)
    assert max(w[1] for w in windows) <= max(0.02, floor + 0.01), windows
