"""Tests of mmte.te.kernels: the Triton kernels against the torch composition they replace.

Triton's interpreter (``TRITON_INTERPRET=1``, kernels on CPU tensors) must be switched on before a
kernel is built, and other tests in the same pytest process may already have imported triton. So the
kernel checks -- the ``check_*`` functions below, which pytest does not collect by default -- run in
one subprocess: ``test_kernels_under_triton_interpreter`` starts ``pytest`` on this file with
``TRITON_INTERPRET=1`` and ``-o python_functions=check_*``. The ``test_*`` functions run in the main
process and cover dispatch, the fallback, input validation, tracing under torch.compile, and the
compiled (GPU) code path, which the interpreter never exercises: every kernel is compiled to an sm_90
cubin by triton's bundled ptxas (no GPU needed). Running the kernels on a GPU is for bench/kernels.py.

Tolerances: fp32 forward and backward within rtol 1.3e-6 / atol 1e-5 (TransformerEngine's fp32
tolerances) of the autograd graph of the torch composition; fp16 within one fp16 rounding of it
(rtol 2e-3, atol 2e-3; the new residual stream is compared exactly). bf16 is not checked in the
interpreter: it converts fp32 -> bf16 by truncation, not round-to-nearest as the hardware does.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mmte.te import LayerNorm, RMSNorm
from mmte.te import kernels as T

REPO = Path(__file__).resolve().parents[2]
HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
FP32 = {"rtol": 1.3e-6, "atol": 1e-5}
FP16 = {"rtol": 2e-3, "atol": 2e-3}


# --------------------------------------------------------------------------------------------------
# main process: the interpreter run, dispatch, fallback, validation
# --------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install 'mmte[triton]')")
def test_kernels_under_triton_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    env.pop("MMTE_DISABLE_TRITON", None)
    cmd = [sys.executable, "-m", "pytest", str(Path(__file__).resolve()), "-q", "-p", "no:cacheprovider",
           "-o", "python_functions=check_*", "-W", "ignore:overflow encountered:RuntimeWarning"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"interpreter run failed (rc {proc.returncode}):\n{out[-8000:]}"
    assert " passed" in out and " failed" not in out and " skipped" not in out, out[-4000:]


def _sm90_compiler():
    """(triton, ASTSource, GPUTarget) when kernels can be compiled for a GPU here without one."""
    if not HAS_TRITON:
        pytest.skip("triton is not installed (pip install 'mmte[triton]')")
    import triton

    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as e:  # pragma: no cover - another triton layout
        pytest.skip(f"this triton has no ahead-of-time compile API: {e}")
    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("this triton install ships no ptxas to compile for NVIDIA GPUs")
    if T.interpreter_mode():
        pytest.skip("this pytest process imported triton for the interpreter; kernels are not compiled then")
    return triton, ASTSource, GPUTarget


@pytest.mark.parametrize("kernel", ["add_norm_fwd", "add_norm_bwd", "bias_act_fwd", "bias_act_bwd"])
def test_kernels_compile_for_sm90(kernel):
    """The GPU code path (which the interpreter does not exercise) compiles to a cubin for sm_90.

    No GPU is needed: triton lowers to PTX and its bundled ptxas assembles it. bf16 storage, every
    optional input on, at ViT-B shapes (D = 768, MLP width 3072), with the launch's tile sizes.
    """
    triton, ASTSource, GPUTarget = _sm90_compiler()
    p, f = "*bf16", "*fp32"
    bm, bd, wn = T.norm_tiles(768)
    am, an, wa = T.act_tiles(3072)
    norm_flags = {"HAS_BIAS": True, "IS_RMS": False, "ZERO_CENTERED": True, "BLOCK_M": bm, "BLOCK_D": bd}
    specs = {
        "add_norm_fwd": ([p, p, f, f, p, p, f, f, "i32", "i32", "fp32"], dict(HAS_RES=True, STORE_H=True, **norm_flags), wn),
        "add_norm_bwd": ([p, p, p, f, f, f, p, f, f, "i32", "i32", "i32"], dict(HAS_DH=True, **norm_flags), wn),
        "bias_act_fwd": ([p, p, p, "i32", "i32"], {"HAS_BIAS": True, "ACT": 0, "BLOCK_M": am, "BLOCK_N": an}, wa),
        "bias_act_bwd": ([p, p, p, p, f, "i32", "i32", "i32"], {"HAS_BIAS": True, "ACT": 0, "BLOCK_M": am, "BLOCK_N": an}, wa),
    }
    types, consts, warps = specs[kernel]
    from mmte.te.kernels import jit

    fn = getattr(jit, kernel)
    names = fn.arg_names
    signature = dict(zip(names, types)) | {k: "constexpr" for k in consts}
    assert list(signature) == names, f"kernel arguments changed: {names}"
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps})  # fmt: skip
    assert len(compiled.asm["cubin"]) > 1000
    assert f".entry {kernel}" in compiled.asm["ptx"]


def test_cpu_without_interpreter_falls_back(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("MMTE_DISABLE_TRITON", raising=False)
    x = torch.randn(2, 3, 8)
    ok, why = T.available("cpu")
    assert not ok and ("TRITON_INTERPRET" in why or "triton" in why)
    assert not T.dispatches_to_triton(x)
    with pytest.raises(RuntimeError, match="cannot run here"):
        T.fused_add_layer_norm(x, x, torch.ones(8), None, impl="triton")
    # "auto" runs the composition: the values of F.layer_norm / F.rms_norm / F.gelu on x + r
    r, w, b = torch.randn(2, 3, 8), torch.randn(8), torch.randn(8)
    y, h = T.fused_add_layer_norm(x, r, w, b, 1e-5)
    torch.testing.assert_close(h, x + r, rtol=0, atol=0)
    torch.testing.assert_close(y, F.layer_norm(x + r, (8,), w, b, 1e-5), rtol=0, atol=0)
    y, h = T.fused_add_rms_norm(x, None, w, 1e-6)
    assert h is x
    torch.testing.assert_close(y, F.rms_norm(x, (8,), w, 1e-6), rtol=0, atol=0)
    torch.testing.assert_close(T.bias_gelu(x, b, "tanh"), F.gelu(x + b, approximate="tanh"), rtol=0, atol=0)


def test_disable_switch(monkeypatch):
    monkeypatch.setenv("MMTE_DISABLE_TRITON", "1")
    assert T.available() == (False, "MMTE_DISABLE_TRITON=1")
    assert not T.dispatches_to_triton(torch.randn(4, 8))


def test_available_reports_triton(monkeypatch):
    monkeypatch.delenv("MMTE_DISABLE_TRITON", raising=False)
    ok, why = T.available()
    assert ok == HAS_TRITON
    assert (why == "") == HAS_TRITON


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install 'mmte[triton]')")
def test_late_triton_interpret_is_reported(monkeypatch):
    import triton  # noqa: F401  (as torch.compile or another test may already have done)

    if T.interpreter_mode():
        pytest.skip("this pytest process imported triton for the interpreter (TRITON_INTERPRET=1 from the start)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("MMTE_DISABLE_TRITON", raising=False)
    ok, why = T.available("cpu")
    assert not ok and "after triton had been imported" in why
    assert not T.dispatches_to_triton(torch.randn(2, 8))
    with pytest.raises(RuntimeError, match="after triton had been imported"):
        T.bias_gelu(torch.randn(2, 8), None, impl="triton")


def test_fp64_empty_and_wide_rows_use_the_composition():
    # decided before availability, so the same on every machine
    assert not T.dispatches_to_triton(torch.randn(2, 8, dtype=torch.float64))
    assert not T.dispatches_to_triton(torch.randn(1, T.MAX_HIDDEN + 1))
    assert not T.dispatches_to_triton(torch.randn(0, 8))
    wide = torch.randn(1, T.MAX_HIDDEN + 1)
    with pytest.raises(ValueError, match="rows of at most"):
        T.fused_add_rms_norm(wide, None, torch.ones(wide.shape[-1]), impl="triton")
    with pytest.raises(TypeError, match="float32/float16/bfloat16"):
        T.bias_gelu(torch.randn(2, 8, dtype=torch.float64), None, impl="triton")
    with pytest.raises(TypeError, match="got torch.float64"):
        T.fused_add_layer_norm(torch.randn(2, 8), torch.randn(2, 8, dtype=torch.float64), torch.ones(8), None, impl="triton")
    y, _h = T.fused_add_rms_norm(wide, wide, torch.ones(wide.shape[-1]))  # "auto": the composition
    torch.testing.assert_close(y, F.rms_norm(2 * wide, (wide.shape[-1],), eps=1e-5), **FP32)


def test_inside_torch_compile_the_composition_is_traced():
    """In a compiled region the ops fall back to the composition, which inductor fuses (no graph break)."""

    def block(x, r, w, b, b1):
        y, h = T.fused_add_layer_norm(x, r, w, b, 1e-5)
        return T.bias_gelu(y, b1) + h

    x, r, w, b, b1 = (torch.randn(4, 16), torch.randn(4, 16), torch.randn(16), torch.randn(16), torch.randn(16))
    got = torch.compile(block, fullgraph=True)(x, r, w, b, b1)
    want = F.gelu(F.layer_norm(x + r, (16,), w, b, 1e-5) + b1) + (x + r)
    torch.testing.assert_close(got, want, **FP32)


@pytest.mark.parametrize(
    "call, err, match",
    [
        (lambda x, w: T.fused_add_layer_norm(x, torch.randn(2, 5, 7), w, None), ValueError,
         r"residual must have the shape.*\(2, 5, 8\).*\(2, 5, 7\)"),
        (lambda x, w: T.fused_add_layer_norm(x, x.long(), w, None), TypeError, "residual must be a floating-point"),
        (lambda x, w: T.fused_add_layer_norm(x, None, torch.ones(7), None), ValueError, r"weight must have shape \(8,\).*\(7,\)"),
        (lambda x, w: T.fused_add_layer_norm(x, None, w, torch.ones(2, 8)), ValueError, r"bias must have shape \(8,\).*\(2, 8\)"),
        (lambda x, w: T.fused_add_layer_norm(x, None, w, None, eps=0.0), ValueError, "eps must be a positive"),
        (lambda x, w: T.fused_add_layer_norm(x.long(), None, w, None), TypeError, "x must be a floating-point"),
        (lambda x, w: T.fused_add_layer_norm(x, None, None, None), ValueError, "weight must be a tensor"),
        (lambda x, w: T.fused_add_rms_norm(x, None, w, impl="cuda"), ValueError, "impl must be one of"),
        (lambda x, w: T.bias_gelu(x, None, approximate="erf"), ValueError, "approximate must be 'none' or 'tanh'; got 'erf'"),
        (lambda x, w: T.bias_activation(x, None, "swiglu"), ValueError, "activation must be one of.*'swiglu'"),
        (lambda x, w: T.bias_silu(x, torch.ones(9)), ValueError, r"bias must have shape \(8,\)"),
        (lambda x, w: T.bias_relu([1.0], None), TypeError, "x must be a torch.Tensor"),
    ],
)
def test_bad_input_raises(call, err, match):
    with pytest.raises(err, match=match):
        call(torch.randn(2, 5, 8), torch.ones(8))


# --------------------------------------------------------------------------------------------------
# inside the TRITON_INTERPRET=1 subprocess: the kernels themselves
# --------------------------------------------------------------------------------------------------


def _grads(out, inputs, cot):
    """Gradients of sum(out_i * cot_i) w.r.t. the inputs that are tensors."""
    leaves = [t for t in inputs if t is not None]
    loss = sum((o * c).sum() for o, c in zip(out, cot) if c is not None)
    return torch.autograd.grad(loss, leaves)


def _leaf(*shape, scale=1.0, dtype=torch.float32):
    return (torch.randn(*shape) * scale).to(dtype).requires_grad_()


def _add_norm(kind, impl, x, r, w, b, eps, zc=False):
    if kind == "layer":
        return T.fused_add_layer_norm(x, r, w, b, eps, zero_centered_gamma=zc, impl=impl)
    return T.fused_add_rms_norm(x, r, w, eps, zero_centered_gamma=zc, impl=impl)


def check_interpreter_is_on():
    x = torch.randn(3, 8)
    assert T.available("cpu") == (True, "")
    assert T.dispatches_to_triton(x)
    from mmte.te.kernels import jit

    assert "add_norm_fwd" in vars(jit)  # built for the interpreter in this process
    assert T.interpreter_mode()


@pytest.mark.parametrize("D", [192, 384, 100])
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("kind", ["layer", "rms"])
def check_add_norm_fp32(kind, with_residual, D):
    torch.manual_seed(D + 7 * with_residual)
    # 37 rows: several row tiles, and (backward) programs that loop over more than one tile
    x, w = _leaf(37, D, scale=2.0), _leaf(D)
    r = _leaf(37, D) + 0.5 if with_residual else None
    r = r.detach().requires_grad_() if r is not None else None
    b = _leaf(D) if kind == "layer" else None
    args = (x, r, w, b)
    y, h = _add_norm(kind, "triton", *args, 1e-5)
    y_ref, h_ref = _add_norm(kind, "torch", *args, 1e-5)
    torch.testing.assert_close(y, y_ref, **FP32)
    torch.testing.assert_close(h, h_ref, rtol=0, atol=0)
    if not with_residual:
        assert h is x
    cot = [torch.randn_like(y), torch.randn_like(y)]  # both outputs used downstream
    for got, want in zip(_grads((y, h), args, cot), _grads((y_ref, h_ref), args, cot)):
        torch.testing.assert_close(got, want, **FP32)


@pytest.mark.parametrize("kind", ["layer", "rms"])
def check_add_norm_unused_residual_output_and_3d(kind):
    torch.manual_seed(1)
    x, r, w = _leaf(2, 5, 64), _leaf(2, 5, 64), _leaf(64)
    b = _leaf(64) if kind == "layer" else None
    args = (x, r, w, b)
    y, h = _add_norm(kind, "triton", *args, 1e-6)
    y_ref, h_ref = _add_norm(kind, "torch", *args, 1e-6)
    assert y.shape == h.shape == (2, 5, 64)
    cot = [torch.randn_like(y), None]  # only the normed output reaches the loss
    for got, want in zip(_grads((y, h), args, cot), _grads((y_ref, h_ref), args, cot)):
        torch.testing.assert_close(got, want, **FP32)
    # only the residual stream reaches the loss: x and r get its gradient, the norm's weight none
    y, h = _add_norm(kind, "triton", *args, 1e-6)
    cot = torch.randn_like(h)
    gx, gr, gw = torch.autograd.grad((h * cot).sum(), (x, r, w), allow_unused=True)
    torch.testing.assert_close(gx, cot, rtol=0, atol=0)
    torch.testing.assert_close(gr, cot, rtol=0, atol=0)
    assert gw is None or not gw.any()


def check_layer_norm_without_bias_and_zero_centered_gamma_matches_modules():
    torch.manual_seed(2)
    D = 96
    ln = LayerNorm(D, 1e-5, zero_centered_gamma=True, bias=False)
    for norm, kind in ((ln, "layer"), (RMSNorm(D, 1e-5, zero_centered_gamma=True), "rms")):
        with torch.no_grad():
            norm.weight.normal_(0, 0.3)
        x, r = _leaf(4, 3, D), _leaf(4, 3, D)
        bias = getattr(norm, "bias", None)
        y, _h = _add_norm(kind, "triton", x, r, norm.weight, bias, norm.eps, zc=True)
        y_ref = norm(x + r)
        torch.testing.assert_close(y, y_ref, **FP32)
        cot = torch.randn_like(y)
        got = torch.autograd.grad((y * cot).sum(), (x, norm.weight))
        want = torch.autograd.grad((y_ref * cot).sum(), (x, norm.weight))
        for g, w_ in zip(got, want):
            torch.testing.assert_close(g, w_, **FP32)


@pytest.mark.parametrize("kind", ["layer", "rms"])
def check_add_norm_fp16(kind):
    torch.manual_seed(3)
    dt = torch.float16
    x, r, w = _leaf(19, 100, dtype=dt), _leaf(19, 100, dtype=dt), _leaf(100, dtype=dt)
    b = _leaf(100, dtype=dt) if kind == "layer" else None
    args = (x, r, w, b)
    y, h = _add_norm(kind, "triton", *args, 1e-5)
    y_ref, h_ref = _add_norm(kind, "torch", *args, 1e-5)
    assert y.dtype == h.dtype == dt
    torch.testing.assert_close(h, h_ref, rtol=0, atol=0)
    torch.testing.assert_close(y, y_ref, **FP16)
    cot = [torch.randn_like(y), torch.randn_like(y)]
    for got, want in zip(_grads((y, h), args, cot), _grads((y_ref, h_ref), args, cot)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-2 if got.dim() == 1 else 2e-3)


@pytest.mark.parametrize("kind", ["layer", "rms"])
def check_add_norm_mixed_dtypes(kind):
    """A half-precision branch output added to an fp32 residual stream (autocast): fp32 sum and output."""
    torch.manual_seed(4)
    x, r, w = _leaf(11, 96, dtype=torch.float16), _leaf(11, 96), _leaf(96)
    b = _leaf(96) if kind == "layer" else None
    args = (x, r, w, b)
    y, h = _add_norm(kind, "triton", *args, 1e-5)
    y_ref, h_ref = _add_norm(kind, "torch", *args, 1e-5)
    assert y.dtype == h.dtype == torch.float32
    torch.testing.assert_close(h, h_ref, rtol=0, atol=0)
    torch.testing.assert_close(y, y_ref, **FP32)
    cot = [torch.randn_like(y), torch.randn_like(y)]
    got, want = _grads((y, h), args, cot), _grads((y_ref, h_ref), args, cot)
    assert [g.dtype for g in got] == [t.dtype for t in args if t is not None]
    for g, w_ in zip(got, want):
        torch.testing.assert_close(g, w_, **(FP16 if g.dtype == torch.float16 else FP32))


def check_rms_norm_eps_none_is_finfo_eps():
    x, r, w = torch.randn(3, 40), torch.randn(3, 40), torch.randn(40)
    y, _h = T.fused_add_rms_norm(x, r, w, None, impl="triton")
    torch.testing.assert_close(y, F.rms_norm(x + r, (40,), w, None), **FP32)


@pytest.mark.parametrize("N", [192, 100, 8])
@pytest.mark.parametrize("activation", list(T.ACTIVATIONS))
def check_bias_activation_fp32(activation, N):
    torch.manual_seed(N)
    x, b = _leaf(2, 13, N, scale=3.0), _leaf(N)  # wide range: the tails of gelu/sigmoid
    y = T.bias_activation(x, b, activation, impl="triton")
    y_ref = T.bias_activation(x, b, activation, impl="torch")
    torch.testing.assert_close(y, y_ref, **FP32)
    cot = [torch.randn_like(y)]
    for got, want in zip(_grads((y,), (x, b), cot), _grads((y_ref,), (x, b), cot)):
        torch.testing.assert_close(got, want, **FP32)


def check_named_wrappers_and_no_bias():
    torch.manual_seed(5)
    x, b = _leaf(6, 40, scale=2.0), _leaf(40)
    u = x + b
    refs = {
        "gelu": (T.bias_gelu(x, b, impl="triton"), F.gelu(u)),
        "gelu_tanh": (T.bias_gelu(x, b, "tanh", impl="triton"), F.gelu(u, approximate="tanh")),
        "quick_gelu": (T.bias_quick_gelu(x, b, impl="triton"), u * torch.sigmoid(1.702 * u)),
        "silu": (T.bias_silu(x, b, impl="triton"), F.silu(u)),
        "relu": (T.bias_relu(x, b, impl="triton"), F.relu(u)),
    }
    for name, (got, want) in refs.items():
        torch.testing.assert_close(got, want, **FP32, msg=lambda m, name=name: f"{name}: {m}")
    y = T.bias_gelu(x, None, impl="triton")
    torch.testing.assert_close(y, F.gelu(x), **FP32)
    (gx,) = torch.autograd.grad(y.sum(), x)
    (gx_ref,) = torch.autograd.grad(F.gelu(x).sum(), x)
    torch.testing.assert_close(gx, gx_ref, **FP32)


def check_bias_activation_fp16():
    torch.manual_seed(6)
    dt = torch.float16
    x, b = _leaf(9, 100, scale=2.0, dtype=dt), _leaf(100, dtype=dt)
    y = T.bias_gelu(x, b, impl="triton")
    y_ref = T.bias_gelu(x, b, impl="torch")
    assert y.dtype == dt
    torch.testing.assert_close(y, y_ref, **FP16)
    cot = [torch.randn_like(y)]
    gx, gb = _grads((y,), (x, b), cot)
    gx_ref, gb_ref = _grads((y_ref,), (x, b), cot)
    torch.testing.assert_close(gx, gx_ref, **FP16)
    torch.testing.assert_close(gb, gb_ref, rtol=2e-3, atol=2e-2)


def check_auto_dispatch_runs_the_kernel():
    """``impl="auto"`` on a CPU tensor under the interpreter must go through the kernels' operators."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = []

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "mmte":
                calls.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    x = torch.randn(3, 16)
    with Ops():
        T.fused_add_layer_norm(x, x, torch.ones(16), torch.zeros(16))
        T.bias_silu(x, torch.zeros(16))
    assert calls == ["add_norm", "bias_act"]


def test_kernels_are_single_ops_to_tracers():
    """The kernels are torch.library operators with fake implementations: a tracer (torch.compile's,
    torch.export's) records each as one op with the right output shapes, without running triton."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def block(x, r, w, b):
        y, h, _mean, _rstd = torch.ops.mmte.add_norm(x, r, w, b, 1e-5, False, False)
        return torch.ops.mmte.bias_act(y, b, T.ACTIVATIONS["gelu"]) + h

    args = (torch.randn(4, 16, dtype=torch.bfloat16), torch.randn(4, 16), torch.randn(16), torch.randn(16))
    gm = make_fx(block, tracing_mode="fake")(*args)
    ops = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "mmte.add_norm.default" in ops and "mmte.bias_act.default" in ops, ops
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    out = out[0] if isinstance(out, (tuple, list)) else out
    assert out.meta["val"].shape == (4, 16) and out.meta["val"].dtype == torch.float32
