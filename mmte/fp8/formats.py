"""FP8 number formats: what E4M3, E5M2 and E8M0 can represent, and how values are cast into them.

An 8-bit float spends its bits on a sign, ``e`` exponent bits and ``m`` mantissa bits. Two layouts are
used for tensors (OCP "FP8 Formats for Deep Learning", adopted by NVIDIA, AMD, Moore Threads, Intel):

=========  ====  ======  ==========  =================  ==============================================
format     e/m   bias    max finite  smallest subnormal special values
=========  ====  ======  ==========  =================  ==============================================
E4M3 (fn)  4/3   7       448         2^-9               no inf; NaN = S.1111.111 (0x7F, 0xFF)
E5M2       5/2   15      57344       2^-16              inf = S.11111.00; NaN = S.11111.{01,10,11}
=========  ====  ======  ==========  =================  ==============================================

A code with exponent field ``E`` and mantissa field ``M`` is ``(-1)^S * 2^(E - bias) * (1 + M / 2^m)``
when ``E > 0`` and ``(-1)^S * 2^(1 - bias) * (M / 2^m)`` when ``E == 0`` (subnormals). E4M3 gives up
infinities to extend its range: its top exponent still holds normal numbers up to 1.75 * 2^8 = 448.

E4M3 has one more bit of precision (relative spacing 2^-3 = 12.5%), E5M2 more range (2^-16 .. 57344).
Activations and weights go to E4M3; gradients, whose magnitudes spread over many decades, to E5M2 —
the ``HYBRID`` format of TransformerEngine.

Scaled casts. A tensor is multiplied by a ``scale`` before the cast so that its largest magnitude
(``amax``) lands near the format's max; the GEMM multiplies the result by ``scale_inv = 1 / scale``.
The cast rounds to nearest, ties to even, and *saturates*: finite values beyond the max and +-inf become
+-max, NaN stays NaN (CUDA's ``__NV_SATFINITE`` conversion mode, what TE's cast kernels use). Saturating
matters for delayed scaling, whose scale comes from earlier steps and may be too large for this one.

E8M0 (``torch.float8_e8m0fnu``) is the scale type of MXFP8: 8 exponent bits, no sign, no mantissa — the
power of two ``2^(code - 127)`` for codes 0..254, and NaN for 255.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

__all__ = ["E4M3", "E5M2", "E8M0_DTYPE", "FP8Dtype", "Format", "cast_to_fp8", "get_format"]

E8M0_DTYPE = torch.float8_e8m0fnu


@dataclass(frozen=True)
class FP8Dtype:
    """One 8-bit floating-point element format.

    Attributes:
        name: ``"E4M3"`` or ``"E5M2"``.
        dtype: the torch dtype holding its codes.
        exponent_bits, mantissa_bits, bias: the bit layout.
        max: the largest finite magnitude.
        has_inf: whether the format encodes infinities.
    """

    name: str
    dtype: torch.dtype
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max: float
    has_inf: bool

    @property
    def max_exponent(self) -> int:
        """``floor(log2(max))``: 8 for E4M3, 15 for E5M2 (the ``emax_elem`` of the OCP MX spec)."""
        return int(torch.tensor(self.max).log2().floor().item())

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (1 - self.bias - self.mantissa_bits)

    def __repr__(self) -> str:
        return self.name


E4M3 = FP8Dtype("E4M3", torch.float8_e4m3fn, 4, 3, 7, 448.0, has_inf=False)
E5M2 = FP8Dtype("E5M2", torch.float8_e5m2, 5, 2, 15, 57344.0, has_inf=True)


class Format(enum.Enum):
    """Which element format each GEMM operand uses (TransformerEngine's ``recipe.Format``).

    ``E4M3``: everything E4M3. ``E5M2``: everything E5M2. ``HYBRID``: activations and weights E4M3
    (forward), gradients E5M2 (backward) — the usual choice for training.
    """

    E4M3 = "E4M3"
    E5M2 = "E5M2"
    HYBRID = "HYBRID"

    @property
    def fwd(self) -> FP8Dtype:
        """Format of activations and weights."""
        return E5M2 if self is Format.E5M2 else E4M3

    @property
    def bwd(self) -> FP8Dtype:
        """Format of output gradients."""
        return E4M3 if self is Format.E4M3 else E5M2


def get_format(fmt: Format | str) -> Format:
    """``Format`` from itself or its name (``"hybrid"``, ``"E4M3"``, ...)."""
    if isinstance(fmt, Format):
        return fmt
    if isinstance(fmt, str) and fmt.upper() in Format.__members__:
        return Format[fmt.upper()]
    raise ValueError(f"fp8_format must be one of {list(Format.__members__)}; got {fmt!r}")


def cast_to_fp8(x: torch.Tensor, fmt: FP8Dtype, scale: torch.Tensor | float | None = None) -> torch.Tensor:
    """Saturating, round-to-nearest-even cast of ``x * scale`` to ``fmt``.

    Args:
        x: any float tensor.
        fmt: :data:`E4M3` or :data:`E5M2`.
        scale: multiplied in before the cast (a scalar, or a tensor broadcastable to ``x``).

    Returns:
        a tensor of ``fmt.dtype`` and ``x``'s shape; +-inf and out-of-range values become +-``fmt.max``,
        NaN stays NaN.
    """
    if not isinstance(fmt, FP8Dtype):
        raise TypeError(f"fmt must be E4M3 or E5M2 (an FP8Dtype); got {fmt!r}")
    y = x.float()
    if scale is not None:
        y = y * scale
    return y.clamp(-fmt.max, fmt.max).to(fmt.dtype)  # clamp keeps NaN
