"""The Triton kernels behind :mod:`mmte.te.kernels`, one ``@triton.jit`` function each.

Importing this module imports triton, which reads ``TRITON_INTERPRET`` once, at import; so
:mod:`mmte.te.kernels.ops` imports it only when a kernel is first launched (see
:func:`mmte.te.kernels.available`). All arithmetic is in fp32 whatever the storage dtype; where the
torch composition rounds an intermediate to the storage dtype (``x + residual`` in bf16), the kernels
round it the same way.

* ``add_norm_fwd``: ``h = x + residual``, ``y = norm(h) * gamma (+ beta)``; writes ``y``, ``h`` and the
  per-row statistics (``mean``/``rstd``, fp32) for the backward.
* ``add_norm_bwd``: ``dx`` (also the residual's gradient) from ``dy``, ``h``, the statistics and the
  gradient of ``h`` when the new residual stream is used downstream; ``dgamma``/``dbeta`` as one
  partial row per program.
* ``bias_act_fwd`` / ``bias_act_bwd``: ``act(x + bias)`` and ``dx = dy * act'(x + bias)`` with partial
  ``dbias`` rows; the activation code is :data:`mmte.te.kernels.ACTIVATIONS`'s.
"""

import triton
import triton.language as tl

__all__ = ["add_norm_bwd", "add_norm_fwd", "bias_act_bwd", "bias_act_fwd"]


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
