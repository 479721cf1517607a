"""The kernels as ``torch.library`` operators, and the public functions that choose between them and
the torch composition.

Each kernel pair is one operator (``mmte::add_norm``, ``mmte::bias_act``) with its backward as another
(``mmte::add_norm_backward``, ``mmte::bias_act_backward``), a fake implementation for tracing and
autograd registered on the forward: ``torch.compile`` and ``torch.export`` see them as single ops with
known output shapes, and eager mode launches the Triton kernel. The public functions validate their
inputs and run the operator where :func:`~mmte.te.kernels.want_triton` says the kernel can run; else the
torch composition (the numerical reference, differentiated by autograd).
"""

import math

import torch
import torch.nn.functional as F

from ._dispatch import act_tiles, cdiv, device_guard, norm_tiles, reduction_split, want_triton

__all__ = [
    "ACTIVATIONS",
    "bias_activation",
    "bias_gelu",
    "bias_quick_gelu",
    "bias_relu",
    "bias_silu",
    "fused_add_layer_norm",
    "fused_add_rms_norm",
]

# Activation names as in mmte.te.LayerNormMLP (its non-gated ones); the value is the kernel's code.
ACTIVATIONS = {"gelu": 0, "gelu_tanh": 1, "quick_gelu": 2, "silu": 3, "relu": 4}
Tensor = torch.Tensor


# ------------------------------------------------------------------------------------ add + norm
@torch.library.custom_op("mmte::add_norm", mutates_args=())
def add_norm_op(
    x: Tensor, residual: Tensor | None, weight: Tensor, bias: Tensor | None, eps: float, is_rms: bool, zero_centered: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(y, h, mean, rstd)``: ``h = x + residual`` (empty without a residual), ``y = norm(h)``."""
    from . import jit

    shape, D = x.shape, x.shape[-1]
    x2 = x.contiguous().view(-1, D)
    r2 = residual.contiguous().view(-1, D) if residual is not None else None
    w, b = weight.contiguous(), (bias.contiguous() if bias is not None else None)
    M = x2.shape[0]
    out_dtype = torch.promote_types(x.dtype, residual.dtype) if residual is not None else x.dtype
    y = torch.empty_like(x2, dtype=out_dtype)
    h = torch.empty_like(x2, dtype=out_dtype) if r2 is not None else x2.new_empty(0)
    mean = torch.empty(M, device=x.device, dtype=torch.float32)
    rstd = torch.empty(M, device=x.device, dtype=torch.float32)
    block_m, block_d, warps = norm_tiles(D)
    with device_guard(x):
        jit.add_norm_fwd[(cdiv(M, block_m),)](
            x2, r2 if r2 is not None else x2, w, b if b is not None else w, y, h if r2 is not None else x2, mean, rstd,
            M, D, float(eps),
            HAS_RES=r2 is not None, STORE_H=r2 is not None, HAS_BIAS=b is not None, IS_RMS=is_rms,
            ZERO_CENTERED=zero_centered, BLOCK_M=block_m, BLOCK_D=block_d, num_warps=warps,
        )  # fmt: skip
    return y.view(shape), (h.view(shape) if r2 is not None else h), mean, rstd


@add_norm_op.register_fake
def _(x, residual, weight, bias, eps, is_rms, zero_centered):
    dt = torch.promote_types(x.dtype, residual.dtype) if residual is not None else x.dtype
    m = x.numel() // x.shape[-1]
    stats = x.new_empty(m, dtype=torch.float32)
    return x.new_empty(x.shape, dtype=dt), (x.new_empty(x.shape, dtype=dt) if residual is not None else x.new_empty(0)), stats, stats.new_empty(m)


@torch.library.custom_op("mmte::add_norm_backward", mutates_args=())
def add_norm_backward_op(
    dy: Tensor, dh: Tensor | None, h: Tensor, weight: Tensor, mean: Tensor, rstd: Tensor, has_bias: bool, is_rms: bool, zero_centered: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """``(dx, dgamma, dbeta)`` of :func:`add_norm_op`; ``dgamma``/``dbeta`` in fp32 (``dbeta`` empty without a bias)."""
    from . import jit

    shape, D = h.shape, h.shape[-1]
    h2 = h.contiguous().view(-1, D)
    M = h2.shape[0]
    dy2 = dy.contiguous().view(-1, D)
    dh2 = dh.contiguous().view(-1, D) if dh is not None else None
    w = weight.contiguous()
    dx = torch.empty_like(h2)
    block_m, block_d, warps = norm_tiles(D)
    g, rows_per_prog = reduction_split(M, block_m, h.device)
    dw_part = torch.empty((g, D), device=h.device, dtype=torch.float32)
    db_part = torch.empty((g, D), device=h.device, dtype=torch.float32) if has_bias else dw_part
    with device_guard(h):
        jit.add_norm_bwd[(g,)](
            dy2, dh2 if dh2 is not None else dy2, h2, w, mean, rstd, dx, dw_part, db_part,
            M, D, rows_per_prog,
            HAS_DH=dh2 is not None, HAS_BIAS=has_bias, IS_RMS=is_rms, ZERO_CENTERED=zero_centered,
            BLOCK_M=block_m, BLOCK_D=block_d, num_warps=warps,
        )  # fmt: skip
    db = db_part.sum(0) if has_bias else dw_part.new_empty(0)
    return dx.view(shape), dw_part.sum(0), db


@add_norm_backward_op.register_fake
def _(dy, dh, h, weight, mean, rstd, has_bias, is_rms, zero_centered):
    D = h.shape[-1]
    return h.new_empty(h.shape), h.new_empty(D, dtype=torch.float32), h.new_empty(D if has_bias else 0, dtype=torch.float32)


def _add_norm_setup(ctx, inputs, output) -> None:
    x, residual, weight, bias, _eps, is_rms, zero_centered = inputs
    _y, h, mean, rstd = output
    ctx.save_for_backward(h if residual is not None else x, weight, mean, rstd)
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no zeros read
    ctx.flags = (residual is not None, bias is not None, is_rms, zero_centered)
    ctx.dtypes = (x.dtype, residual.dtype if residual is not None else None, weight.dtype, bias.dtype if bias is not None else None)


def _add_norm_backward(ctx, dy, dh, _dmean, _drstd):
    has_res, has_bias, is_rms, zero_centered = ctx.flags
    x_dtype, r_dtype, w_dtype, b_dtype = ctx.dtypes
    if dy is None:  # only the new residual stream was used downstream: identity for x and residual
        return dh.to(x_dtype), (dh.to(r_dtype) if has_res else None), None, None, None, None, None
    h, w, mean, rstd = ctx.saved_tensors
    dx, dw, db = torch.ops.mmte.add_norm_backward(dy, dh if has_res else None, h, w, mean, rstd, has_bias, is_rms, zero_centered)
    dw = dw.to(w_dtype) if ctx.needs_input_grad[2] else None
    db = db.to(b_dtype) if has_bias and ctx.needs_input_grad[3] else None
    # d(x + residual)/dx = d/dresidual = identity: both get the same tensor, as for torch's add
    # (cast to each input's dtype when they differ, e.g. a bf16 branch into an fp32 stream)
    return dx.to(x_dtype), (dx.to(r_dtype) if has_res else None), dw, db, None, None, None


add_norm_op.register_autograd(_add_norm_backward, setup_context=_add_norm_setup)


# ------------------------------------------------------------------------------ bias + activation
@torch.library.custom_op("mmte::bias_act", mutates_args=())
def bias_act_op(x: Tensor, bias: Tensor | None, act: int) -> Tensor:
    """``act(x + bias)`` with the activation's code from :data:`ACTIVATIONS`."""
    from . import jit

    shape, N = x.shape, x.shape[-1]
    x2 = x.contiguous().view(-1, N)
    b = bias.contiguous() if bias is not None else None
    M = x2.shape[0]
    y = torch.empty_like(x2)
    block_m, block_n, warps = act_tiles(N)
    with device_guard(x):
        jit.bias_act_fwd[(cdiv(M, block_m), cdiv(N, block_n))](
            x2, b if b is not None else x2, y, M, N,
            HAS_BIAS=b is not None, ACT=act, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps,
        )  # fmt: skip
    return y.view(shape)


@bias_act_op.register_fake
def _(x, bias, act):
    return torch.empty_like(x)


@torch.library.custom_op("mmte::bias_act_backward", mutates_args=())
def bias_act_backward_op(dy: Tensor, x: Tensor, bias: Tensor | None, act: int) -> tuple[Tensor, Tensor]:
    """``(dx, dbias)`` of :func:`bias_act_op`; ``dbias`` in fp32 (empty without a bias)."""
    from . import jit

    shape, N = x.shape, x.shape[-1]
    x2 = x.contiguous().view(-1, N)
    M = x2.shape[0]
    b = bias.contiguous() if bias is not None else None
    dy2 = dy.contiguous().view(-1, N)
    dx = torch.empty_like(x2)
    block_m, block_n, warps = act_tiles(N)
    g, rows_per_prog = reduction_split(M, block_m, x2.device)
    db_part = torch.empty((g, N), device=x2.device, dtype=torch.float32) if b is not None else dx
    with device_guard(x2):
        jit.bias_act_bwd[(g, cdiv(N, block_n))](
            dy2, x2, b if b is not None else x2, dx, db_part, M, N, rows_per_prog,
            HAS_BIAS=b is not None, ACT=act, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps,
        )  # fmt: skip
    return dx.view(shape), (db_part.sum(0) if b is not None else x2.new_empty(0, dtype=torch.float32))


@bias_act_backward_op.register_fake
def _(dy, x, bias, act):
    return torch.empty_like(x), x.new_empty(x.shape[-1] if bias is not None else 0, dtype=torch.float32)


def _bias_act_setup(ctx, inputs, output) -> None:
    x, bias, act = inputs
    ctx.save_for_backward(x, bias)
    ctx.set_materialize_grads(False)
    ctx.act = act


def _bias_act_backward(ctx, dy):
    if dy is None:
        return None, None, None
    x, b = ctx.saved_tensors
    dx, db = torch.ops.mmte.bias_act_backward(dy, x, b, ctx.act)
    db = db.to(b.dtype) if b is not None and ctx.needs_input_grad[1] else None
    return dx, db, None


bias_act_op.register_autograd(_bias_act_backward, setup_context=_bias_act_setup)


# ------------------------------------------------------------- validation and the torch compositions
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


def _add_norm(x, residual, weight, bias, eps, is_rms, zero_centered, impl):
    if not want_triton(impl, x, whole_rows=True, residual=residual):
        return _torch_add_norm(x, residual, weight, bias, eps, is_rms, zero_centered)
    y, h, _mean, _rstd = torch.ops.mmte.add_norm(x, residual, weight, bias, float(eps), is_rms, zero_centered)
    return y, (h if residual is not None else x)


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
    return _add_norm(x, residual, weight, bias, eps, False, zero_centered_gamma, impl)


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
    return _add_norm(x, residual, weight, None, eps, True, zero_centered_gamma, impl)


def _torch_bias_act(x: torch.Tensor, bias: torch.Tensor | None, activation: str) -> torch.Tensor:
    from ..layernorm_mlp import activation_fn

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
    if not want_triton(impl, x, whole_rows=False):
        return _torch_bias_act(x, bias, activation)
    return torch.ops.mmte.bias_act(x, bias, ACTIVATIONS[activation])


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
