"""FP8 GEMMs: error against fp32 per recipe (stated bounds), emulation against torch._scaled_mm, dispatch."""

import pytest
import torch

from mmte import fp8
from mmte.fp8 import MXFP8, BlockScaling, CurrentScaling, DelayedScaling, FP8Linear

# Relative Frobenius error bounds against fp32 for N(0, 1) activations and N(0, 0.05^2) weights
# (measured ~0.037 forward with E4M3 operands and ~0.06 for the E5M2-gradient GEMMs; all-E5M2 ~0.074).
BOUNDS = {  # recipe: (fprop, dgrad, wgrad)
    "delayed": (0.05, 0.08, 0.08),
    "current": (0.05, 0.08, 0.08),
    "block": (0.05, 0.08, 0.08),
    "mx": (0.05, 0.08, 0.08),
    "mx-floor": (0.06, 0.085, 0.085),
    "current-e4m3": (0.05, 0.05, 0.05),
    "current-e5m2": (0.10, 0.10, 0.10),
}
RECIPES = {
    "delayed": DelayedScaling(),
    "current": CurrentScaling(),
    "block": BlockScaling(),
    "mx": MXFP8(),
    "mx-floor": MXFP8(scale_rounding="floor"),
    "current-e4m3": CurrentScaling(fp8_format="E4M3"),
    "current-e5m2": CurrentScaling(fp8_format="E5M2"),
}


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def _run(recipe, x, w, g, bias=None):
    lin = FP8Linear(w.shape[1], w.shape[0], bias=bias is not None, recipe=recipe, device=x.device)
    with torch.no_grad():
        lin.weight.copy_(w)
        if bias is not None:
            lin.bias.copy_(bias)
    xx = x.clone().requires_grad_()
    with fp8.autocast(recipe=recipe):
        y = lin(xx)
    y.backward(g)
    return y.detach(), xx.grad, lin.weight.grad, (lin.bias.grad if bias is not None else None)


@pytest.mark.parametrize("name", list(RECIPES))
def test_gemm_error_against_fp32(name):
    g0 = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g0)
    w = torch.randn(128, 256, generator=g0) * 0.05
    b = torch.randn(128, generator=g0)
    g = torch.randn(64, 128, generator=g0) * 1e-3
    y, dx, dw, db = _run(RECIPES[name], x, w, g, b)
    xr, wr, br = x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()
    yr = xr @ wr.t() + br
    yr.backward(g)
    fprop, dgrad, wgrad = BOUNDS[name]
    assert _rel(y - b, (yr - br).detach()) < fprop
    assert _rel(dx, xr.grad) < dgrad
    assert _rel(dw, wr.grad) < wgrad
    torch.testing.assert_close(db, br.grad, rtol=1e-5, atol=1e-7)  # bias gradient stays high precision
    assert _rel(dx, xr.grad) > 1e-3  # and the GEMMs really ran in FP8


def test_blocks_handle_outlier_rows_better_than_one_scale():
    g0 = torch.Generator().manual_seed(1)
    x = torch.randn(128, 256, generator=g0) * torch.logspace(-4, 1, 128)[:, None]
    w = torch.randn(128, 256, generator=g0) * 0.05
    ref = x @ w.t()
    errs = {}
    for name in ("current", "block", "mx"):
        lin = FP8Linear(256, 128, bias=False, recipe=RECIPES[name])
        with torch.no_grad():
            lin.weight.copy_(w)
        with fp8.autocast(recipe=RECIPES[name]), torch.no_grad():
            y = lin(x)
        row_err = ((y - ref).norm(dim=1) / ref.norm(dim=1))
        errs[name] = row_err[:32].mean().item()  # the small rows
    assert errs["block"] < 0.06 and errs["mx"] < 0.06
    assert errs["current"] > 3 * errs["block"]


@pytest.mark.parametrize("recipe", [DelayedScaling(), CurrentScaling(), CurrentScaling(fp8_format="E4M3")], ids=["delayed", "current", "e4m3"])
def test_emulation_matches_scaled_mm(recipe):
    """The emulation multiplies exactly the values torch._scaled_mm multiplies (CPU kernel here)."""
    from dataclasses import replace

    g0 = torch.Generator().manual_seed(2)
    x = torch.randn(48, 64, generator=g0)
    w = torch.randn(32, 64, generator=g0) * 0.1
    g = torch.randn(48, 32, generator=g0) * 1e-2
    out_e = _run(replace(recipe, gemm="emulate"), x, w, g)
    out_h = _run(replace(recipe, gemm="scaled_mm"), x, w, g)
    for a, b in zip(out_e[:3], out_h[:3]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_fp8_gemm_shape_checks_and_dispatch():
    q = fp8.quantize_tensorwise(torch.ones(16, 32), fp8.E4M3, 1.0)
    with pytest.raises(ValueError, match=r"a \[M, K\] and b \[N, K\]; got \(16, 32\) and \(16, 16\)"):
        fp8.fp8_gemm(q, fp8.quantize_tensorwise(torch.ones(16, 16), fp8.E4M3, 1.0))
    bad = fp8.quantize_tensorwise(torch.ones(10, 32), fp8.E4M3, 1.0)
    with pytest.raises(ValueError, match="divisible by 16; got M=10, N=16, K=32"):
        fp8.fp8_gemm(bad, q, path="scaled_mm")
    assert fp8.select_gemm("cpu", DelayedScaling()) == "emulate"
    assert fp8.select_gemm("cpu", DelayedScaling(gemm="scaled_mm")) == "scaled_mm"
    assert fp8.select_gemm("cpu", MXFP8()) == "emulate"


def test_is_available_names_missing_capability():
    ok, why = fp8.is_available("cpu", MXFP8())
    assert ok and "emulated" in why
    ok, why = fp8.is_available("cpu", DelayedScaling(gemm="scaled_mm"))
    assert ok and "_scaled_mm" in why
    for r, cap in ((MXFP8(gemm="scaled_mm"), "capability >= 10.0"), (BlockScaling(gemm="scaled_mm"), "capability >= 9.0")):
        ok, why = fp8.is_available("cpu", r)
        assert not ok and cap in why and "cpu" in why
    lin = FP8Linear(32, 32, recipe=MXFP8(gemm="scaled_mm"))
    with pytest.raises(RuntimeError, match=r"MXFP8 with gemm='scaled_mm' needs block-scaled FP8 GEMM kernels"), \
            fp8.autocast(recipe=MXFP8(gemm="scaled_mm")):
        lin(torch.randn(16, 32))
    if not torch.cuda.is_available():
        ok, why = fp8.is_available("cuda", DelayedScaling(gemm="scaled_mm"))
        assert not ok and "CUDA is not available" in why
    with pytest.raises(TypeError, match="Recipe"):
        fp8.is_available("cpu", "delayed")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_scaled_mm_on_cuda_matches_emulation():  # pragma: no cover - GPU only
    cap = torch.cuda.get_device_capability()
    if cap < (8, 9):
        pytest.skip(f"FP8 tensor cores need capability >= 8.9; this GPU has {cap}")
    g0 = torch.Generator().manual_seed(3)
    x, w, g = torch.randn(64, 128, generator=g0), torch.randn(64, 128, generator=g0) * 0.1, torch.randn(64, 64, generator=g0)
    out_e = _run(CurrentScaling(gemm="emulate"), x, w, g)
    out_h = _run(CurrentScaling(gemm="scaled_mm"), x.cuda(), w.cuda(), g.cuda())
    for a, b in zip(out_e[:3], out_h[:3]):
        torch.testing.assert_close(a, b.cpu(), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("kind", ["block", "mx"])
def test_block_scaled_gemm_equals_per_block_accumulation(kind):
    """What block-scaled hardware computes: per contraction block, an exact product of FP8 codes, then
    the two blocks' scales applied, summed over blocks. The emulation (dequantize, fp32 matmul) agrees."""
    g0 = torch.Generator().manual_seed(4)
    a = torch.randn(32, 256, generator=g0) * torch.logspace(-2, 2, 32)[:, None]
    b = torch.randn(256, 256, generator=g0) * 0.05
    if kind == "block":
        qa = fp8.quantize_blockwise(a, fp8.E4M3, (1, 128))
        qb = fp8.quantize_blockwise(b, fp8.E4M3, (128, 128))
        kb, rows_b = 128, 128
    else:
        qa = fp8.quantize_mx(a, fp8.E4M3, 32)
        qb = fp8.quantize_mx(b, fp8.E4M3, 32)
        kb, rows_b = 32, 1
    ca, cb = qa.data.double(), qb.data.double()  # codes; float64 holds every partial sum exactly
    sa, sb = qa.scale_inv.double(), qb.scale_inv.double()
    ref = torch.zeros(32, 256, dtype=torch.float64)
    for j in range(256 // kb):
        part = ca[:, j * kb : (j + 1) * kb] @ cb[:, j * kb : (j + 1) * kb].t()
        ref += part * sa[:, j][:, None] * sb[torch.arange(256) // rows_b, j][None, :]
    got = fp8.fp8_gemm(qa, qb)
    torch.testing.assert_close(got.double(), ref, rtol=2e-6, atol=1e-6 * ref.abs().max().item())
