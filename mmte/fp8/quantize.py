"""Quantize and dequantize: tensors to FP8 codes plus scales, and back.

A :class:`QuantizedTensor` is what an FP8 GEMM consumes: ``data`` (FP8 codes, the tensor's shape) and
``scale_inv`` (the dequantization factors: ``x ~= data * scale_inv``). The layout of ``scale_inv`` says
which values share a scale:

* tensorwise: a 0-d fp32 tensor (delayed and current scaling);
* blockwise ``(br, bc)``: fp32 ``[ceil(R / br), ceil(C / bc)]`` for a 2-d ``[R, C]`` tensor — (1, 128)
  activation tiles and (128, 128) weight blocks of the block recipe;
* MX ``(1, 32)``: the same layout with E8M0 (power-of-two) scales.

Blocks run along the *last* dimension, which the GEMMs here always make the contraction dimension. A
partial last block (a dimension that is not a multiple of the block) is quantized as if padded with
zeros, which do not change its amax; hardware kernels need whole blocks, so the shapes FP8 layers see in
practice are multiples of the block.

Choosing a scale from an amax (max |x| of the values sharing it):

* per tensor / fp32 blocks: ``scale = fp8_max / amax / 2**margin``; ``amax == 0`` or non-finite -> 1;
* power-of-two blocks: that scale rounded *down* to a power of two (never saturates);
* MX: ``scale_inv = 2^e`` with the smallest ``e`` such that ``amax <= fp8_max * 2^e`` (``"ceil"``) or
  ``e = floor(log2 amax) - emax_elem`` (``"floor"``, OCP), clamped to E8M0's ``[-127, 127]``; an all-zero
  block gets 2^-127 and a block holding NaN/inf a NaN scale (E8M0 code 0xFF).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .formats import E8M0_DTYPE, FP8Dtype, cast_to_fp8

__all__ = [
    "QuantizedTensor",
    "amax",
    "mx_scale_exponent",
    "quantize_blockwise",
    "quantize_mx",
    "quantize_tensorwise",
    "scale_from_amax",
]


@dataclass
class QuantizedTensor:
    """FP8 codes with their dequantization scales.

    Attributes:
        data: FP8 codes (``fmt.dtype``), the shape of the original tensor.
        scale_inv: 0-d fp32 (tensorwise) or ``[ceil(R/br), ceil(C/bc)]`` (fp32 or E8M0) for ``block``.
        fmt: the element format.
        block: ``None`` for tensorwise, else the block shape ``(br, bc)``.
    """

    data: torch.Tensor
    scale_inv: torch.Tensor
    fmt: FP8Dtype
    block: tuple[int, int] | None = None

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def nbytes(self) -> int:
        """Bytes of codes plus scales."""
        return self.data.numel() * self.data.element_size() + self.scale_inv.numel() * self.scale_inv.element_size()

    def scale_inv_full(self) -> torch.Tensor:
        """``scale_inv`` expanded to ``data``'s shape (fp32)."""
        s = self.scale_inv.float()
        if self.block is None:
            return s
        r, c = self.data.shape
        br, bc = self.block
        return s.repeat_interleave(br, 0)[:r].repeat_interleave(bc, 1)[:, :c]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``data * scale_inv`` (computed in fp32, then cast to ``dtype``)."""
        return (self.data.float() * self.scale_inv_full()).to(dtype)

    def t(self) -> QuantizedTensor:
        """The transpose (tensorwise or square blocks only: other block shapes must be requantized)."""
        if self.block is not None and self.block[0] != self.block[1]:
            raise ValueError(f"a {self.block[0]}x{self.block[1]}-block quantized tensor has no transpose; requantize it")
        s = self.scale_inv if self.block is None else self.scale_inv.t()
        return QuantizedTensor(self.data.t(), s, self.fmt, self.block)


def amax(x: torch.Tensor) -> torch.Tensor:
    """``max |x|`` as a 0-d fp32 tensor (NaN if ``x`` holds NaN; 0 for an empty tensor)."""
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    return x.detach().abs().amax().float()


def scale_from_amax(a: torch.Tensor, fp8_max: float, margin: int = 0, power_2: bool = False) -> torch.Tensor:
    """``fp8_max / amax / 2**margin`` elementwise; 1 where amax is 0 or not finite.

    With ``power_2`` the scale is rounded down to a power of two.
    """
    a = a.float()
    s = (fp8_max / a) / math.ldexp(1.0, margin)
    ok = torch.isfinite(a) & (a > 0) & torch.isfinite(s)
    s = torch.where(ok, s, torch.ones_like(s))
    if power_2:
        _mant, exp = torch.frexp(s)  # s = mant * 2^exp, mant in [0.5, 1)
        s = torch.ldexp(torch.ones_like(s), exp - 1)
    return s


def quantize_tensorwise(x: torch.Tensor, fmt: FP8Dtype, scale: torch.Tensor | float) -> QuantizedTensor:
    """Cast ``x * scale`` to ``fmt`` with one scale for the whole tensor."""
    scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device).reshape(())
    return QuantizedTensor(cast_to_fp8(x, fmt, scale), (1.0 / scale).float(), fmt, None)


def _blocks(x: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, int, int]:
    """``x`` [R, C] zero-padded to whole blocks and viewed as [R/br, br, C/bc, bc]."""
    if x.dim() != 2:
        raise ValueError(f"blockwise quantization expects a 2-d tensor [R, C]; got shape {tuple(x.shape)}")
    r, c = x.shape
    br, bc = block
    pr, pc = (-r) % br, (-c) % bc
    xp = F.pad(x.float(), (0, pc, 0, pr)) if (pr or pc) else x.float()
    return xp.view((r + pr) // br, br, (c + pc) // bc, bc), r, c


def quantize_blockwise(x: torch.Tensor, fmt: FP8Dtype, block: tuple[int, int], power_2_scale: bool = False) -> QuantizedTensor:
    """One fp32 scale per ``block`` of a 2-d tensor (1x128 tiles, 128x128 blocks).

    Args:
        x: ``[R, C]``; blocks run along C (the contraction dimension) first.
        fmt: element format.
        block: ``(br, bc)``.
        power_2_scale: round scales down to powers of two.
    """
    xb, r, c = _blocks(x, block)
    a = xb.abs().amax(dim=(1, 3))  # [R/br, C/bc]
    scale = scale_from_amax(a, fmt.max, 0, power_2_scale)
    q = cast_to_fp8(xb, fmt, scale[:, None, :, None]).view(xb.shape[0] * block[0], xb.shape[2] * block[1])[:r, :c]
    return QuantizedTensor(q.contiguous(), 1.0 / scale, fmt, tuple(block))


def mx_scale_exponent(a: torch.Tensor, fmt: FP8Dtype, rounding: str = "ceil") -> torch.Tensor:
    """The E8M0 exponent ``e`` (int32) of an MX block with amax ``a`` (see the module docstring)."""
    a = a.float()
    finite_pos = torch.isfinite(a) & (a > 0)
    safe = torch.where(finite_pos, a, torch.ones_like(a))
    if rounding == "ceil":
        mant, exp = torch.frexp(safe / fmt.max)  # (a / max) = mant * 2^exp, mant in [0.5, 1)
        e = torch.where(mant == 0.5, exp - 1, exp)
        # a / max rounds in fp32: settle the boundary exactly (multiplying by a power of two is exact)
        e = torch.where(safe > fmt.max * torch.ldexp(torch.ones_like(safe), e), e + 1, e)
    elif rounding == "floor":
        mant, exp = torch.frexp(safe)
        e = (exp - 1) - fmt.max_exponent
    else:
        raise ValueError(f"MX scale rounding must be 'ceil' or 'floor'; got {rounding!r}")
    e = torch.where(finite_pos, e, torch.full_like(e, -127))
    return e.clamp(-127, 127).to(torch.int32)


def quantize_mx(x: torch.Tensor, fmt: FP8Dtype, block_size: int = 32, rounding: str = "ceil") -> QuantizedTensor:
    """MXFP8: one E8M0 scale per ``1 x block_size`` block along the last dimension of ``x`` [R, C]."""
    xb, r, c = _blocks(x, (1, block_size))
    a = xb.abs().amax(dim=(1, 3))  # [R, C/bs]
    e = mx_scale_exponent(a, fmt, rounding)
    scale_inv = torch.ldexp(torch.ones_like(a), e)
    bad = ~torch.isfinite(a)
    scale_inv = torch.where(bad, torch.full_like(scale_inv, float("nan")), scale_inv)
    # dividing by a power of two is exact, so this is the hardware's exponent subtraction
    q = cast_to_fp8(xb / scale_inv[:, None, :, None], fmt).view(xb.shape[0], xb.shape[2] * block_size)[:r, :c]
    return QuantizedTensor(q.contiguous(), scale_inv.to(E8M0_DTYPE), fmt, (1, block_size))
