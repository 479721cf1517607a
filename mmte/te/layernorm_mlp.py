"""``LayerNormMLP``: norm -> fc1 -> activation -> fc2, the feed-forward block of a transformer layer.

Gated activations (``swiglu``, ``geglu``) use a second input projection, ``up``, multiplied with the
activated ``fc1`` output: ``fc2(act(fc1(x)) * up(x))``. Keeping the two halves in separate GEMM modules
(rather than one fc1 of twice the width) means a column-wise tensor-parallel split keeps each rank's
gate and value halves together.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .linear import Linear
from .norm import make_norm

__all__ = ["ACTIVATIONS", "GATED_ACTIVATIONS", "LayerNormMLP", "activation_fn"]


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """CLIP's GELU approximation ``x * sigmoid(1.702 x)``."""
    return x * torch.sigmoid(1.702 * x)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


_BASE = {
    "gelu": F.gelu,  # exact (erf), as ViT / BERT
    "gelu_tanh": _gelu_tanh,
    "quick_gelu": quick_gelu,
    "relu": F.relu,
    "silu": F.silu,
}
GATED_ACTIVATIONS = {"swiglu": F.silu, "geglu": F.gelu}
ACTIVATIONS = tuple(_BASE) + tuple(GATED_ACTIVATIONS)


def activation_fn(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The element-wise function for an activation name (the gate's for gated ones)."""
    if name in _BASE:
        return _BASE[name]
    if name in GATED_ACTIVATIONS:
        return GATED_ACTIVATIONS[name]
    raise ValueError(f"activation must be one of {list(ACTIVATIONS)}; got {name!r}")


class LayerNormMLP(nn.Module):
    """``fc2(act(fc1(norm(x))))``.

    Args:
        hidden_size: input and output size.
        ffn_hidden_size: the intermediate size.
        eps: norm epsilon.
        bias: GEMM biases.
        normalization: ``"LayerNorm"``, ``"RMSNorm"`` or ``None`` (post-norm layers).
        activation: one of :data:`ACTIVATIONS`.
        zero_centered_gamma, init_method, output_layer_init_method, params_dtype, device: as in TE.

    Submodules (stable names): ``norm``, ``fc1``, ``up`` (gated activations only), ``fc2``.
    """

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        eps: float = 1e-5,
        bias: bool = True,
        *,
        normalization: str | None = "LayerNorm",
        activation: str = "gelu",
        zero_centered_gamma: bool = False,
        init_method: Callable[[torch.Tensor], None] | None = None,
        output_layer_init_method: Callable[[torch.Tensor], None] | None = None,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        self.act = activation_fn(activation)  # validates the name
        self.activation = activation
        self.hidden_size, self.ffn_hidden_size = hidden_size, ffn_hidden_size
        kw = {"params_dtype": params_dtype, "device": device}
        self.norm = make_norm(normalization, hidden_size, eps, zero_centered_gamma=zero_centered_gamma, **kw)
        self.fc1 = Linear(hidden_size, ffn_hidden_size, bias, init_method=init_method, **kw)
        self.up = Linear(hidden_size, ffn_hidden_size, bias, init_method=init_method, **kw) if activation in GATED_ACTIVATIONS else None
        self.fc2 = Linear(ffn_hidden_size, hidden_size, bias, init_method=output_layer_init_method or init_method, **kw)

    def reset_parameters(self) -> None:
        for m in (self.norm, self.fc1, self.up, self.fc2):
            if m is not None and hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.hidden_size:
            raise ValueError(f"LayerNormMLP expects inputs [..., {self.hidden_size}]; got shape {tuple(x.shape)}")
        h = self.norm(x)
        a = self.act(self.fc1(h))
        if self.up is not None:
            a = a * self.up(h)
        return self.fc2(a)
