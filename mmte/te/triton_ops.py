"""Hand-written Triton kernels for the memory-bound parts of a transformer layer.

Between the GEMMs of a transformer layer everything is memory bound: the time is the bytes moved, not
the arithmetic. Run op by op, the residual add and the norm that follows it read and write the hidden
state several times (``h = x + r`` writes ``h``; ``layer_norm(h)`` reads it again, and its backward
reads ``h``, ``dy`` and the saved statistics in separate passes). The kernels here do each such chain
in one pass:

* :func:`fused_add_layer_norm` / :func:`fused_add_rms_norm` -- ``h = x + residual`` and
  ``y = norm(h) * gamma (+ beta)`` in one kernel: it reads ``x`` and ``residual`` once and writes ``y``
  and ``h`` once, plus the per-row statistics (``mean``/``rstd``, fp32, ``[M]``) for the backward.
  The backward is one Triton kernel too: it reads ``dy``, ``h``, the statistics (and the gradient of
  ``h`` when the new residual stream is used downstream), writes ``dx`` once -- which is also the
  residual's gradient, as for ``x + residual`` -- and accumulates ``dgamma``/``dbeta`` in registers,
  one partial row per program; ``torch.sum`` over those few partial rows finishes them.
* :func:`bias_gelu` (erf or tanh), :func:`bias_quick_gelu`, :func:`bias_silu`, :func:`bias_relu`:
  ``act(x + bias)`` in one pass forward; the backward kernel recomputes ``x + bias``, writes
  ``dx = dy * act'(x + bias)`` and accumulates ``dbias`` the same way.

All arithmetic is in fp32 whatever the storage dtype (fp32, fp16, bf16). Where the torch composition
rounds an intermediate to the storage dtype (``x + residual`` in bf16), the kernels round it the same
way, so results match the composition up to fp32 reassociation. ``x`` and ``residual`` may differ in
dtype (a bf16 branch into an fp32 residual stream under autocast): the sum and the normalised output
take the promoted dtype, as ``x + residual`` would.

Dispatch (``impl="auto"``): the Triton kernels run when triton imports and the tensor is on a CUDA
device, or on a CPU tensor when ``TRITON_INTERPRET=1`` is set (Triton's interpreter, for tests), and
a norm's row fits one tile (``hidden <= 8192``). Otherwise -- and inside ``torch.compile`` regions, where
inductor fuses the composition itself -- the exact torch composition runs. ``MMTE_DISABLE_TRITON=1``
forces the composition. :func:`available` says which applies and why.

Importing this module does not import triton; the kernels are built on first use. Triton reads
``TRITON_INTERPRET`` once, when it is imported, so the interpreter needs the variable set before
anything in the process imports triton (torch.compile does); :func:`available` reports a late one.
"""

import contextlib
import functools
import importlib.util
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

__all__ = [
    "ACTIVATIONS",
    "available",
    "bias_activation",
    "bias_gelu",
    "bias_quick_gelu",
    "bias_relu",
    "bias_silu",
    "dispatches_to_triton",
    "fused_add_layer_norm",
    "fused_add_rms_norm",
]

# Activation names as in mmte.te.LayerNormMLP (its non-gated ones); the value is the kernel's code.
ACTIVATIONS = {"gelu": 0, "gelu_tanh": 1, "quick_gelu": 2, "silu": 3, "relu": 4}
_IMPLS = ("auto", "triton", "torch")
_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HIDDEN = 8192  # widest row one program normalises in registers (wider ones would spill)


# --------------------------------------------------------------------------------------------------
# Availability and dispatch
# --------------------------------------------------------------------------------------------------


def _env_interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _interpreter_mode() -> bool:
    """Whether triton was imported for its interpreter (it reads ``TRITON_INTERPRET`` at import:
    its own ``tl`` functions are then interpreted, and so must every kernel be)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.standard.sum, InterpretedFunction)


@functools.cache
def _triton_import() -> tuple[bool, str]:
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed (pip install 'mmte[triton]')"
    try:
        import triton
        import triton.language  # noqa: F401
    except Exception as e:  # noqa: BLE001  # pragma: no cover - a broken install raises anything; reported
        return False, f"triton does not import: {type(e).__name__}: {e}"
    return True, ""


def available(device: torch.device | str | None = None) -> tuple[bool, str]:
    """Whether the Triton kernels can run (on ``device`` when given); ``(False, reason)`` if not.

    Args:
        device: ``None`` asks only whether triton imports; a device also asks whether kernels can run
            on it (CUDA; the CPU only under ``TRITON_INTERPRET=1``).

    Returns:
        ``(True, "")`` or ``(False, reason)``.
    """
    if os.environ.get("MMTE_DISABLE_TRITON", "0") == "1":
        return False, "MMTE_DISABLE_TRITON=1"
    cpu_why = "Triton kernels run on CPU tensors only under TRITON_INTERPRET=1 (the interpreter)"
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cpu" and not _env_interpret() and "triton" not in sys.modules:
        return False, cpu_why  # without importing triton for nothing
    ok, why = _triton_import()
    if not ok or dev is None:
        return ok, why
    if _interpreter_mode():
        return True, ""  # the interpreter runs kernels on CPU tensors (and, slowly, on CUDA ones)
    if _env_interpret():
        return False, ("TRITON_INTERPRET=1 was set after triton had been imported in this process; triton reads it at "
                       "import, so set it before anything imports triton")  # fmt: skip
    if dev.type == "cuda":
        return True, ""
    if dev.type == "cpu":
        return False, cpu_why
    return False, f"no Triton backend wired for device type {dev.type!r} (expected cuda, or cpu with TRITON_INTERPRET=1)"


def _is_compiling() -> bool:
    fn = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(fn()) if fn is not None else False


def dispatches_to_triton(x: torch.Tensor, hidden: int | None = None) -> bool:
    """Whether ``impl="auto"`` runs the Triton kernel for ``x`` (else the torch composition).

    Args:
        x: the input activation.
        hidden: the normalised/feature size (defaults to ``x.shape[-1]``).
    """
    if _is_compiling() or x.dtype not in _KERNEL_DTYPES or x.numel() == 0:
        return False
    if (hidden if hidden is not None else x.shape[-1]) > MAX_HIDDEN:
        return False
    return available(x.device)[0]


def _want_triton(impl: str, x: torch.Tensor, *, whole_rows: bool, residual: torch.Tensor | None = None) -> bool:
    """Resolve ``impl`` for ``x``; ``whole_rows``: the kernel keeps a row in registers (the norms)."""
    if impl not in _IMPLS:
        raise ValueError(f"impl must be one of {list(_IMPLS)}; got {impl!r}")
    if impl == "torch":
        return False
    r_ok = residual is None or residual.dtype in _KERNEL_DTYPES
    if impl == "auto":
        return r_ok and dispatches_to_triton(x, None if whole_rows else 1)
    if x.dtype not in _KERNEL_DTYPES or not r_ok:
        got = x.dtype if x.dtype not in _KERNEL_DTYPES else residual.dtype
        raise TypeError(f"the Triton kernels take float32/float16/bfloat16 tensors; got {got}")
    if whole_rows and x.shape[-1] > MAX_HIDDEN:
        raise ValueError(f"the Triton kernels take rows of at most {MAX_HIDDEN} elements; got {x.shape[-1]}")
    ok, why = available(x.device)
    if not ok:
        raise RuntimeError(f"impl='triton' requested but the Triton kernels cannot run here: {why}")
    return True


def _device_guard(t: torch.Tensor):
    """Make ``t``'s accelerator the current one while a kernel launches (Triton launches there)."""
    if t.device.type == "cpu" or t.device.index is None:
        return contextlib.nullcontext()
    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "device_index"):
        return acc.device_index(t.device.index)
    return contextlib.nullcontext()  # pragma: no cover - torch < 2.7


@functools.cache
def _num_programs_for_reduction(device_type: str, index: int | None) -> int:
    """How many programs share a column reduction (2 per SM on a GPU; few in the interpreter)."""
    if device_type == "cpu":
        return 4
    try:
        from triton.runtime import driver

        props = driver.active.utils.get_device_properties(index or 0)
        return 2 * int(props["multiprocessor_count"])
    except (ImportError, AttributeError, KeyError, RuntimeError):  # pragma: no cover - depends on the GPU driver
        return 256


# --------------------------------------------------------------------------------------------------
# Kernels (built on first use; see the module docstring)
# --------------------------------------------------------------------------------------------------


def _build_kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def add_norm_fwd(
        X, R, W, B, Y, H, Mean, Rstd,
        M, D, eps,
        HAS_RES: tl.constexpr, STORE_H: tl.constexpr, HAS_BIAS: tl.constexpr, IS_RMS: tl.constexpr,
        ZERO_CENTERED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_D)
        rmask = rows < M
        cmask = cols < D
        mask = rmask[:, None] & cmask[None, :]
        offs = rows.to(tl.int64)[:, None] * D + cols[None, :]
        h = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES:
            r = tl.load(R + offs, mask=mask, other=0.0).to(tl.float32)
            # round the sum to its storage dtype, as ``x + residual`` does, before normalising it
            h = (h + r).to(H.dtype.element_ty).to(tl.float32)
            if STORE_H:
                tl.store(H + offs, h.to(H.dtype.element_ty), mask=mask)
        if IS_RMS:
            rstd = tl.math.rsqrt(tl.sum(h * h, axis=1) / D + eps)
            xhat = h * rstd[:, None]
        else:
            mean = tl.sum(h, axis=1) / D
            d = tl.where(mask, h - mean[:, None], 0.0)
            rstd = tl.math.rsqrt(tl.sum(d * d, axis=1) / D + eps)
            xhat = d * rstd[:, None]
            tl.store(Mean + rows, mean, mask=rmask)
        tl.store(Rstd + rows, rstd, mask=rmask)
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
        if ZERO_CENTERED:
            w = w + 1.0
        y = xhat * w[None, :]
        if HAS_BIAS:
            y = y + tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def add_norm_bwd(
        DY, DH, H, W, Mean, Rstd, DX, DW, DB,
        M, D, rows_per_prog,
        HAS_DH: tl.constexpr, HAS_BIAS: tl.constexpr, IS_RMS: tl.constexpr, ZERO_CENTERED: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK_D)
        cmask = cols < D
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
        if ZERO_CENTERED:
            w = w + 1.0
        dw = tl.zeros([BLOCK_D], dtype=tl.float32)
        db = tl.zeros([BLOCK_D], dtype=tl.float32)
        row_start = pid * rows_per_prog
        row_end = tl.minimum(row_start + rows_per_prog, M)
        for start in range(row_start, row_end, BLOCK_M):
            rows = start + tl.arange(0, BLOCK_M)
            rmask = rows < row_end
            mask = rmask[:, None] & cmask[None, :]
            offs = rows.to(tl.int64)[:, None] * D + cols[None, :]
            h = tl.load(H + offs, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
            rstd = tl.load(Rstd + rows, mask=rmask, other=0.0)
            if IS_RMS:
                xhat = h * rstd[:, None]
            else:
                mean = tl.load(Mean + rows, mask=rmask, other=0.0)
                xhat = tl.where(mask, (h - mean[:, None]) * rstd[:, None], 0.0)
            wdy = dy * w[None, :]
            c1 = tl.sum(xhat * wdy, axis=1) / D
            if IS_RMS:
                dx = (wdy - xhat * c1[:, None]) * rstd[:, None]
            else:
                c2 = tl.sum(wdy, axis=1) / D
                dx = (wdy - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
            if HAS_DH:
                dx = dx + tl.load(DH + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
            dw += tl.sum(dy * xhat, axis=0)
            if HAS_BIAS:
                db += tl.sum(dy, axis=0)
        tl.store(DW + pid * D + cols, dw, mask=cmask)
        if HAS_BIAS:
            tl.store(DB + pid * D + cols, db, mask=cmask)

    @triton.jit
    def bias_act_fwd(
        X, B, Y, M, N,
        HAS_BIAS: tl.constexpr, ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N
        mask = (rows < M)[:, None] & cmask[None, :]
        offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
        u = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            u = u + tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
            u = u.to(X.dtype.element_ty).to(tl.float32)  # ``x + bias`` is rounded, as in torch
        if ACT == 0:  # gelu, erf form: u * Phi(u)
            y = 0.5 * u * (1.0 + tl.math.erf(u * 0.7071067811865476))
        elif ACT == 1:  # gelu, tanh form: 0.5 u (1 + tanh(z)) == u * sigmoid(2 z)
            z = 0.7978845608028654 * (u + 0.044715 * u * u * u)
            y = u * tl.sigmoid(2.0 * z)
        elif ACT == 2:  # quick_gelu
            y = u * tl.sigmoid(1.702 * u)
        elif ACT == 3:  # silu
            y = u * tl.sigmoid(u)
        else:  # relu
            y = tl.maximum(u, 0.0)
        tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def bias_act_bwd(
        DY, X, B, DX, DB, M, N, rows_per_prog,
        HAS_BIAS: tl.constexpr, ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N
        if HAS_BIAS:
            b = tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)
        db = tl.zeros([BLOCK_N], dtype=tl.float32)
        row_start = pid * rows_per_prog
        row_end = tl.minimum(row_start + rows_per_prog, M)
        for start in range(row_start, row_end, BLOCK_M):
            rows = start + tl.arange(0, BLOCK_M)
            mask = (rows < row_end)[:, None] & cmask[None, :]
            offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
            u = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
            if HAS_BIAS:
                u = (u + b[None, :]).to(X.dtype.element_ty).to(tl.float32)
            dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
            if ACT == 0:  # Phi(u) + u phi(u)
                cdf = 0.5 * (1.0 + tl.math.erf(u * 0.7071067811865476))
                pdf = 0.3989422804014327 * tl.exp(-0.5 * u * u)
                g = cdf + u * pdf
            elif ACT == 1:  # s + 2 u s (1 - s) z'(u),  s = sigmoid(2 z)
                z = 0.7978845608028654 * (u + 0.044715 * u * u * u)
                s = tl.sigmoid(2.0 * z)
                dz = 0.7978845608028654 * (1.0 + 0.134145 * u * u)
                g = s + 2.0 * u * s * (1.0 - s) * dz
            elif ACT == 2:
                s = tl.sigmoid(1.702 * u)
                g = s + 1.702 * u * s * (1.0 - s)
            elif ACT == 3:
                s = tl.sigmoid(u)
                g = s * (1.0 + u * (1.0 - s))
            else:
                g = tl.where(u > 0.0, 1.0, 0.0)
            dx = dy * g
            dx_st = dx.to(DX.dtype.element_ty)
            tl.store(DX + offs, dx_st, mask=mask)
            if HAS_BIAS:
                # dbias sums the stored gradient of ``x + bias``, as autograd does
                db += tl.sum(tl.where(mask, dx_st.to(tl.float32), 0.0), axis=0)
        if HAS_BIAS:
            tl.store(DB + pid * N + cols, db, mask=cmask)

    return {"add_norm_fwd": add_norm_fwd, "add_norm_bwd": add_norm_bwd, "bias_act_fwd": bias_act_fwd, "bias_act_bwd": bias_act_bwd}


@functools.cache
def _kernels() -> dict:
    """The kernels, built once, in the mode triton was imported in (interpreter or compiler)."""
    return _build_kernels()


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _norm_tiles(D: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_D, num_warps) for a row length ``D``.

    Whole rows, about 2048 elements per tile and 8 per thread (16 at D = 8192): compiled for sm_90,
    D = 768/1024 then takes 40 (forward) and 79 (backward) registers a thread and nothing spills up to
    D = 4096, so enough warps stay resident to keep the memory system busy.
    """
    block_d = _next_pow2(D)
    block_m = max(1, min(16, 2048 // block_d))
    num_warps = min(16, max(4, block_m * block_d // 256))
    return block_m, block_d, num_warps


def _reduction_split(M: int, block_m: int, device: torch.device) -> tuple[int, int]:
    """(programs, rows_per_program) for a backward that reduces over rows into partial sums."""
    g = min(_cdiv(M, block_m), _num_programs_for_reduction(device.type, device.index))
    rows_per_prog = _cdiv(_cdiv(M, g), block_m) * block_m
    return _cdiv(M, rows_per_prog), rows_per_prog


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------------------------------
# autograd.Functions around the kernels
# --------------------------------------------------------------------------------------------------


class _AddNormFn(torch.autograd.Function):
    """``(y, h)`` with ``h = x + residual`` and ``y = norm(h)``; just ``y`` when residual is None."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps, is_rms, zero_centered):
        shape, D = x.shape, x.shape[-1]
        x2 = x.contiguous().view(-1, D)
        r2 = residual.contiguous().view(-1, D) if residual is not None else None
        w, b = weight.contiguous(), (bias.contiguous() if bias is not None else None)
        M = x2.shape[0]
        out_dtype = torch.promote_types(x.dtype, residual.dtype) if residual is not None else x.dtype
        y = torch.empty_like(x2, dtype=out_dtype)
        h = torch.empty_like(x2, dtype=out_dtype) if r2 is not None else x2
        mean = torch.empty(M, device=x.device, dtype=torch.float32)
        rstd = torch.empty(M, device=x.device, dtype=torch.float32)
        block_m, block_d, warps = _norm_tiles(D)
        with _device_guard(x):
            _kernels()["add_norm_fwd"][(_cdiv(M, block_m),)](
                x2, r2 if r2 is not None else x2, w, b if b is not None else w, y, h, mean, rstd,
                M, D, float(eps),
                HAS_RES=r2 is not None, STORE_H=r2 is not None, HAS_BIAS=b is not None, IS_RMS=is_rms,
                ZERO_CENTERED=zero_centered, BLOCK_M=block_m, BLOCK_D=block_d, num_warps=warps,
            )  # fmt: skip
        ctx.save_for_backward(h, w, mean, rstd)
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no zeros read
        ctx.flags = (residual is not None, bias is not None, is_rms, zero_centered, shape)
        ctx.param_dtypes = (weight.dtype, bias.dtype if bias is not None else None)
        ctx.in_dtypes = (x.dtype, residual.dtype if residual is not None else None)
        if residual is None:
            return y.view(shape)
        return y.view(shape), h.view(shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh=None):
        has_res, has_bias, is_rms, zero_centered, shape = ctx.flags
        x_dtype, r_dtype = ctx.in_dtypes
        if dy is None:  # only the new residual stream was used downstream: identity for x and residual
            return dh.to(x_dtype), (dh.to(r_dtype) if has_res else None), None, None, None, None, None
        h, w, mean, rstd = ctx.saved_tensors
        M, D = h.shape
        dy2 = dy.contiguous().view(-1, D)
        dh2 = dh.contiguous().view(-1, D) if dh is not None else None
        dx = torch.empty_like(h)
        block_m, block_d, warps = _norm_tiles(D)
        g, rows_per_prog = _reduction_split(M, block_m, h.device)
        dw_part = torch.empty((g, D), device=h.device, dtype=torch.float32)
        db_part = torch.empty((g, D), device=h.device, dtype=torch.float32) if has_bias else dw_part
        with _device_guard(h):
            _kernels()["add_norm_bwd"][(g,)](
                dy2, dh2 if dh2 is not None else dy2, h, w, mean, rstd, dx, dw_part, db_part,
                M, D, rows_per_prog,
                HAS_DH=dh2 is not None, HAS_BIAS=has_bias, IS_RMS=is_rms, ZERO_CENTERED=zero_centered,
                BLOCK_M=block_m, BLOCK_D=block_d, num_warps=warps,
            )  # fmt: skip
        w_dtype, b_dtype = ctx.param_dtypes
        dw = dw_part.sum(0).to(w_dtype) if ctx.needs_input_grad[2] else None
        db = db_part.sum(0).to(b_dtype) if has_bias and ctx.needs_input_grad[3] else None
        dx = dx.view(shape)
        # d(x + residual)/dx = d/dresidual = identity: both get the same tensor, as for torch's add
        # (cast to each input's dtype when they differ, e.g. a bf16 branch into an fp32 stream)
        return dx.to(x_dtype), (dx.to(r_dtype) if has_res else None), dw, db, None, None, None


class _BiasActFn(torch.autograd.Function):
    """``act(x + bias)`` with the activation's code from :data:`ACTIVATIONS`."""

    @staticmethod
    def forward(ctx, x, bias, act):
        shape, N = x.shape, x.shape[-1]
        x2 = x.contiguous().view(-1, N)
        b = bias.contiguous() if bias is not None else None
        M = x2.shape[0]
        y = torch.empty_like(x2)
        block_m, block_n, warps = _act_tiles(N)
        with _device_guard(x):
            _kernels()["bias_act_fwd"][(_cdiv(M, block_m), _cdiv(N, block_n))](
                x2, b if b is not None else x2, y, M, N,
                HAS_BIAS=b is not None, ACT=act, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps,
            )  # fmt: skip
        ctx.save_for_backward(x2, b)
        ctx.set_materialize_grads(False)
        ctx.act, ctx.shape = act, shape
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return y.view(shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        if dy is None:
            return None, None, None
        x2, b = ctx.saved_tensors
        M, N = x2.shape
        dy2 = dy.contiguous().view(-1, N)
        dx = torch.empty_like(x2)
        block_m, block_n, warps = _act_tiles(N)
        g, rows_per_prog = _reduction_split(M, block_m, x2.device)
        db_part = torch.empty((g, N), device=x2.device, dtype=torch.float32) if b is not None else dx
        with _device_guard(x2):
            _kernels()["bias_act_bwd"][(g, _cdiv(N, block_n))](
                dy2, x2, b if b is not None else x2, dx, db_part, M, N, rows_per_prog,
                HAS_BIAS=b is not None, ACT=ctx.act, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps,
            )  # fmt: skip
        db = db_part.sum(0).to(ctx.bias_dtype) if b is not None and ctx.needs_input_grad[1] else None
        return dx.view(ctx.shape), db, None


def _act_tiles(N: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for the element-wise bias+activation kernels: tiles of at most
    8 x 256 (16 elements a thread at 4 warps; 64/80 registers forward/backward for GELU on sm_90)."""
    block_n = min(256, _next_pow2(N))
    return min(64, 2048 // block_n), block_n, 4


# --------------------------------------------------------------------------------------------------
# The public API: validation, dispatch, and the torch compositions (the numerical reference)
# --------------------------------------------------------------------------------------------------


def _check_float(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor; got dtype {t.dtype}")


def _check_vector(name: str, t: torch.Tensor | None, D: int, x: torch.Tensor, what: str) -> None:
    if t is None:
        return
    _check_float(name, t)
    if tuple(t.shape) != (D,):
        raise ValueError(f"{name} must have shape ({D},) to match the {what} size of x {tuple(x.shape)}; got {tuple(t.shape)}")
    if t.device != x.device:
        raise ValueError(f"{name} is on {t.device} but x is on {x.device}")


def _check_add_norm(x, residual, weight, bias, eps) -> None:
    _check_float("x", x)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must be [..., D] with D >= 1; got shape {tuple(x.shape)}")
    if residual is not None:
        _check_float("residual", residual)
        if residual.shape != x.shape:
            raise ValueError(f"residual must have the shape of x {tuple(x.shape)}; got {tuple(residual.shape)}")
        if residual.device != x.device:
            raise ValueError(f"residual is on {residual.device} but x is on {x.device}")
    if weight is None:
        raise ValueError("weight must be a tensor of shape (D,); got None")
    _check_vector("weight", weight, x.shape[-1], x, "hidden")
    _check_vector("bias", bias, x.shape[-1], x, "hidden")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps > 0 or not math.isfinite(eps):
        raise ValueError(f"eps must be a positive finite float; got {eps!r}")


def _torch_add_norm(x, residual, weight, bias, eps, is_rms, zero_centered):
    h = x + residual if residual is not None else x
    w = weight + 1 if zero_centered else weight
    w = w.to(h.dtype)
    if is_rms:
        y = F.rms_norm(h, (h.shape[-1],), w, eps)
    else:
        y = F.layer_norm(h, (h.shape[-1],), w, bias.to(h.dtype) if bias is not None else None, eps)
    return y.to(h.dtype), h  # .to: a no-op except under autocast, which runs norms in fp32


def fused_add_layer_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float = 1e-5,
    *,
    zero_centered_gamma: bool = False,
    impl: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual``; ``normed = LayerNorm(h)`` -- one kernel forward, one backward.

    Args:
        x: the branch output, (B, N, D) or any (..., D); float32, float16 or bfloat16.
        residual: the residual stream, same shape as ``x``, or None (then ``h = x``). Its dtype may
            differ (a bf16 branch output into an fp32 stream): ``h`` takes the promoted dtype.
        weight: gamma, (D,) (``gamma - 1`` when ``zero_centered_gamma``); any float dtype.
        bias: beta, (D,), or None.
        eps: added to the variance.
        zero_centered_gamma: ``weight`` stores ``gamma - 1`` (as :class:`mmte.te.LayerNorm`).
        impl: ``"auto"`` (Triton where it can run, else torch), ``"triton"`` (error if it cannot run)
            or ``"torch"`` (the composition ``F.layer_norm(x + residual)``).

    Returns:
        ``(normed, new_residual)``, both shaped like ``x`` in the dtype of ``x + residual`` (also under
        autocast, where a plain norm would return fp32). ``new_residual`` is ``x`` itself when
        ``residual`` is None.

    Raises:
        ValueError: shapes, devices or ``eps`` are wrong. TypeError: a non-float tensor.
    """
    _check_add_norm(x, residual, weight, bias, eps)
    if not _want_triton(impl, x, whole_rows=True, residual=residual):
        return _torch_add_norm(x, residual, weight, bias, eps, False, zero_centered_gamma)
    if residual is None:
        return _AddNormFn.apply(x, None, weight, bias, eps, False, zero_centered_gamma), x
    return _AddNormFn.apply(x, residual, weight, bias, eps, False, zero_centered_gamma)


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float | None = 1e-5,
    *,
    zero_centered_gamma: bool = False,
    impl: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual``; ``normed = RMSNorm(h) = h * rsqrt(mean(h^2) + eps) * gamma``.

    Same arguments, returns and errors as :func:`fused_add_layer_norm`, without ``bias``; the torch
    composition is ``F.rms_norm(x + residual)``. ``eps=None`` means ``torch.finfo(dtype).eps`` of the
    sum's dtype, as in ``F.rms_norm`` / ``nn.RMSNorm``.
    """
    if eps is None and isinstance(x, torch.Tensor) and x.is_floating_point():
        dt = torch.promote_types(x.dtype, residual.dtype) if isinstance(residual, torch.Tensor) else x.dtype
        eps = torch.finfo(dt).eps
    _check_add_norm(x, residual, weight, None, eps)
    if not _want_triton(impl, x, whole_rows=True, residual=residual):
        return _torch_add_norm(x, residual, weight, None, eps, True, zero_centered_gamma)
    if residual is None:
        return _AddNormFn.apply(x, None, weight, None, eps, True, zero_centered_gamma), x
    return _AddNormFn.apply(x, residual, weight, None, eps, True, zero_centered_gamma)


def _torch_bias_act(x: torch.Tensor, bias: torch.Tensor | None, activation: str) -> torch.Tensor:
    from .layernorm_mlp import activation_fn

    u = x + bias.to(x.dtype) if bias is not None else x
    return activation_fn(activation)(u)


def bias_activation(x: torch.Tensor, bias: torch.Tensor | None, activation: str, *, impl: str = "auto") -> torch.Tensor:
    """``act(x + bias)`` in one pass; the bias-add and activation after a GEMM such as ``fc1``.

    Args:
        x: (..., F) GEMM output without its bias; float32, float16 or bfloat16.
        bias: (F,) or None.
        activation: one of :data:`ACTIVATIONS` (the names :class:`mmte.te.LayerNormMLP` uses).
        impl: ``"auto"``, ``"triton"`` or ``"torch"`` (see :func:`fused_add_layer_norm`).

    Returns:
        A tensor shaped like ``x``, in its dtype.

    Raises:
        ValueError: unknown activation, or ``bias`` of the wrong shape/device. TypeError: non-float input.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {list(ACTIVATIONS)}; got {activation!r}")
    _check_float("x", x)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must be [..., F] with F >= 1; got shape {tuple(x.shape)}")
    _check_vector("bias", bias, x.shape[-1], x, "feature")
    if not _want_triton(impl, x, whole_rows=False):
        return _torch_bias_act(x, bias, activation)
    return _BiasActFn.apply(x, bias, ACTIVATIONS[activation])


def bias_gelu(x: torch.Tensor, bias: torch.Tensor | None, approximate: str = "none", *, impl: str = "auto") -> torch.Tensor:
    """``gelu(x + bias)``, exact (``approximate="none"``, erf) or ``"tanh"``, as ``F.gelu``."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh'; got {approximate!r}")
    return bias_activation(x, bias, "gelu" if approximate == "none" else "gelu_tanh", impl=impl)


def bias_quick_gelu(x: torch.Tensor, bias: torch.Tensor | None, *, impl: str = "auto") -> torch.Tensor:
    """``u * sigmoid(1.702 u)`` with ``u = x + bias`` (CLIP's GELU)."""
    return bias_activation(x, bias, "quick_gelu", impl=impl)


def bias_silu(x: torch.Tensor, bias: torch.Tensor | None, *, impl: str = "auto") -> torch.Tensor:
    """``silu(x + bias)``."""
    return bias_activation(x, bias, "silu", impl=impl)


def bias_relu(x: torch.Tensor, bias: torch.Tensor | None, *, impl: str = "auto") -> torch.Tensor:
    """``relu(x + bias)``."""
    return bias_activation(x, bias, "relu", impl=impl)
