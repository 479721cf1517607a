"""Scaled FP8 GEMMs: the hardware kernel where there is one, an exact emulation everywhere else.

An FP8 GEMM computes ``(A_q * sA) @ (B_q * sB)^T``: FP8 codes are multiplied exactly (an E4M3 x E4M3
product has at most 8 significant bits), summed in fp32 and scaled by the dequantization factors.
Every GEMM here has the "TN" form cuBLASLt's FP8 kernels require: both operands ``[rows, K]`` with the
contraction ``K`` along their last dimension. The linear layer arranges its three GEMMs that way::

    fprop   y  [M, N] = x   [M, K] . W   [N, K]^T
    dgrad   dx [M, K] = dy  [M, N] . W^T [K, N]^T
    wgrad   dW [N, K] = dy^T[N, M] . x^T [K, M]^T

Paths:

* ``scaled_mm``: ``torch._scaled_mm`` with per-tensor scales — CUDA compute capability >= 8.9 (Ada,
  Hopper, Blackwell) and, slowly, the CPU. Only tensorwise recipes (delayed / current scaling).
* ``emulate``: dequantize both operands (``data * scale_inv``, exactly the values the hardware
  multiplies) and multiply in fp32. The result differs from the hardware's only by the order of the
  fp32 accumulation, so CPU tests cover FP8 numerics. Block and MX recipes always take this path in
  the native backend (their hardware kernels come with the ``te`` backend); on a GPU it is slower than
  bf16, on this CPU faster than ``torch._scaled_mm``.
"""

from __future__ import annotations

import torch

from .quantize import QuantizedTensor
from .recipes import Recipe

__all__ = ["fp8_gemm", "is_available", "scaled_mm_capable", "select_gemm"]

_MIN_CUDA_CAPABILITY = (8, 9)


def _device_type(device) -> str:
    return torch.device(device).type if device is not None else "cpu"


def scaled_mm_capable(device: torch.device | str | None) -> tuple[bool, str]:
    """Whether ``torch._scaled_mm`` with per-tensor scales runs on ``device`` — (ok, reason)."""
    t = _device_type(device)
    if not hasattr(torch, "_scaled_mm"):
        return False, f"this torch ({torch.__version__}) has no torch._scaled_mm"
    if t == "cpu":
        return True, "torch._scaled_mm on the CPU"
    if t == "cuda":
        from .. import device as mdev

        if not mdev.is_available("cuda"):
            return False, "CUDA is not available"
        cap = mdev.info(device).capability
        if cap is None or tuple(cap) < _MIN_CUDA_CAPABILITY:
            return False, (
                f"FP8 tensor cores need CUDA compute capability >= {_MIN_CUDA_CAPABILITY[0]}.{_MIN_CUDA_CAPABILITY[1]} "
                f"(Ada/Hopper/Blackwell); {device} has {cap}"
            )
        return True, f"torch._scaled_mm on CUDA capability {cap[0]}.{cap[1]}"
    return False, f"no FP8 GEMM kernel is wired for device type {t!r} in the native backend (use backend='te')"


def select_gemm(device: torch.device | str | None, recipe: Recipe) -> str:
    """``"scaled_mm"`` or ``"emulate"`` for this device and recipe; raises when ``recipe.gemm`` cannot be met.

    ``"auto"`` takes ``scaled_mm`` on CUDA (capability >= 8.9) for tensorwise recipes, and the emulation
    elsewhere (on the CPU the fp32 emulation is faster than the CPU's ``_scaled_mm``).
    """
    if recipe.gemm == "emulate":
        return "emulate"
    ok, why = scaled_mm_capable(device)
    if recipe.gemm == "scaled_mm":
        if not recipe.tensorwise:
            raise RuntimeError(
                f"{recipe.name} with gemm='scaled_mm' needs block-scaled FP8 GEMM kernels "
                f"({'1x128/128x128 blocks, CUDA capability >= 9.0' if recipe.name == 'BlockScaling' else 'MX E8M0 scales, CUDA capability >= 10.0'}), "
                f"which the native backend does not provide on {torch.device(device) if device is not None else 'cpu'}; "
                "use gemm='emulate' or 'auto', or backend='te'"
            )
        if not ok:
            raise RuntimeError(f"{recipe.name} with gemm='scaled_mm' cannot run: {why}")
        return "scaled_mm"
    if recipe.tensorwise and ok and _device_type(device) == "cuda":
        return "scaled_mm"
    return "emulate"


def is_available(device: torch.device | str | None = None, recipe: Recipe | None = None) -> tuple[bool, str]:
    """Can ``recipe`` run on ``device``, and how? Returns ``(ok, reason)``.

    The reason names the GEMM path (hardware or emulated) or, when ``ok`` is False, the missing
    capability (e.g. ``recipe.gemm='scaled_mm'`` on a GPU older than compute capability 8.9).
    """
    from .recipes import DelayedScaling

    recipe = recipe if recipe is not None else DelayedScaling()
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be an mmte.fp8 Recipe; got {type(recipe).__name__}")
    try:
        path = select_gemm(device, recipe)
    except RuntimeError as e:
        return False, str(e)
    if path == "scaled_mm":
        return True, f"{recipe.name}: hardware FP8 GEMMs ({scaled_mm_capable(device)[1]})"
    return True, f"{recipe.name}: emulated FP8 GEMMs on {_device_type(device)} (exact FP8 rounding, fp32 matmul)"


def fp8_gemm(
    a: QuantizedTensor,
    b: QuantizedTensor,
    out_dtype: torch.dtype = torch.float32,
    path: str = "emulate",
) -> torch.Tensor:
    """``dequant(a) @ dequant(b)^T``: ``a`` [M, K], ``b`` [N, K] -> [M, N] in ``out_dtype``.

    Args:
        a, b: quantized operands, contraction along their last dimension.
        out_dtype: result dtype.
        path: ``"scaled_mm"`` (tensorwise operands only) or ``"emulate"``.
    """
    if a.data.dim() != 2 or b.data.dim() != 2 or a.data.shape[1] != b.data.shape[1]:
        raise ValueError(f"fp8_gemm expects a [M, K] and b [N, K]; got {tuple(a.data.shape)} and {tuple(b.data.shape)}")
    if path == "scaled_mm" and a.block is None and b.block is None and not (a.fmt.name == b.fmt.name == "E5M2"):
        m, k = a.data.shape
        n = b.data.shape[0]
        if m % 16 or n % 16 or k % 16:
            raise ValueError(f"torch._scaled_mm needs every GEMM dimension divisible by 16; got M={m}, N={n}, K={k}")
        return torch._scaled_mm(
            a.data.contiguous(), b.data.contiguous().t(), a.scale_inv.float(), b.scale_inv.float(), out_dtype=torch.float32
        ).to(out_dtype)
    if path not in ("scaled_mm", "emulate"):
        raise ValueError(f"path must be 'scaled_mm' or 'emulate'; got {path!r}")
    with torch.autocast(a.data.device.type, enabled=False):
        return (a.dequantize() @ b.dequantize().t()).to(out_dtype)
