"""``Linear``: the one GEMM module of mmte.te and the point where FP8 plugs in.

Every GEMM in the backbone (QKV, attention projection, fc1, fc2) is an instance of this class, so
``mmte.fp8.convert`` replaces exactly these modules and tensor-parallel plans (which shard
``nn.Linear``) apply to them unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .lowp import LOW_PRECISION, cast_param

__all__ = ["Linear", "default_init"]


def default_init(weight: torch.Tensor) -> None:
    """PyTorch's default ``nn.Linear`` weight init (Kaiming-uniform with a=sqrt(5))."""
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))


class Linear(nn.Linear):
    """``y = x W^T + b`` with TE's argument names.

    Inputs in bf16/fp16 with fp32 parameters run the GEMM in the inputs' dtype (the bf16 path of
    :mod:`mmte.te.lowp`): frozen weights from a cached copy, trainable ones cast through autograd.
    Inference copies swap in :class:`mmte.inference.PackedLinear` (a subclass) for prepacked CPU GEMMs.

    Args:
        in_features, out_features: GEMM sizes.
        bias: whether to learn a bias.
        init_method: called on the weight in :meth:`reset_parameters` (default: PyTorch's).
        params_dtype, device: parameter dtype and device (``"meta"`` for deferred init).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        init_method: Callable[[torch.Tensor], None] | None = None,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        self.init_method = init_method
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=params_dtype)

    def reset_parameters(self) -> None:
        if self.init_method is None:
            super().reset_parameters()
            return
        self.init_method(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., in] -> [..., out]``; bf16/fp16 inputs use the weight in their dtype (see :mod:`mmte.te.lowp`)."""
        w, b = self.weight, self.bias
        if x.dtype != w.dtype and x.dtype in LOW_PRECISION:
            w = cast_param(w, x.dtype)
            b = cast_param(b, x.dtype) if b is not None else None
        return F.linear(x, w, b)
