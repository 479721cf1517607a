"""``TransformerLayer``: one encoder block, pre-norm (ViT, CLIP) or post-norm (BERT).

Pre-norm::

    x = x + drop_path(ls1(dropout(attn(norm1(x)))))
    x = x + drop_path(ls2(dropout(mlp(norm2(x)))))

Post-norm::

    x = norm1(x + dropout(attn(x)))
    x = norm2(x + dropout(mlp(x)))

In pre-norm layers the norms live inside the GEMM modules (``self_attention.layernorm_qkv.norm`` and
``layernorm_mlp.norm``), as in TransformerEngine; post-norm layers own ``post_attention_layernorm``
and ``post_mlp_layernorm`` instead.

Speed-ups are module swaps applied to a built model, not branches here: hand-written Triton kernels
(:func:`mmte.te.kernels.use_kernels`) and, for CPU inference copies, prepacked GEMMs and a flat layer
(:mod:`mmte.inference`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .attention import MultiheadAttention
from .layernorm_mlp import LayerNormMLP
from .lowp import LOW_PRECISION, cast_param
from .norm import make_norm

__all__ = ["DropPath", "LayerScale", "TransformerLayer"]

class DropPath(nn.Module):
    """Stochastic depth: zero a whole sample's residual branch with probability ``p`` (training only),
    scaling kept samples by ``1 / (1 - p)``."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"drop_path probability must be in [0, 1); got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        shape = (x.shape[0],) + (1,) * (x.dim() - 1)
        return x * x.new_empty(shape).bernoulli_(keep).div_(keep)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class LayerScale(nn.Module):
    """Per-channel learnable scale (CaiT / DeiT-III); parameter name ``gamma`` as timm."""

    def __init__(self, dim: int, init_value: float, *, params_dtype=None, device=None):
        super().__init__()
        self.init_value = init_value
        self.gamma = nn.Parameter(torch.empty(dim, dtype=params_dtype, device=device))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.gamma, self.init_value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = cast_param(self.gamma, x.dtype) if x.dtype in LOW_PRECISION else self.gamma
        return x * g


class TransformerLayer(nn.Module):
    """A transformer encoder layer with TE's argument names.

    Args:
        hidden_size: model width ``D``.
        ffn_hidden_size: MLP intermediate width.
        num_attention_heads: number of heads.
        layernorm_epsilon: epsilon of every norm.
        hidden_dropout: dropout on each branch's output before the residual add.
        attention_dropout: dropout on attention probabilities.
        kv_channels: head size (default ``D // H``).
        self_attn_mask_type: ``"no_mask"``, ``"padding"``, ``"causal"``, ``"padding_causal"``.
        normalization: ``"LayerNorm"`` or ``"RMSNorm"``.
        activation: MLP activation (``gelu``, ``gelu_tanh``, ``quick_gelu``, ``relu``, ``silu``,
            ``swiglu``, ``geglu``).
        bias: biases of the projection and MLP GEMMs.
        qkv_bias: bias of the QKV GEMM (default: ``bias``).
        layer_norm_position: ``"pre"`` (ViT, CLIP) or ``"post"`` (BERT).
        drop_path_rate: stochastic-depth probability of both residual branches.
        layer_scale_init: initial value of per-channel layer scale (None: no layer scale).
        attention_backend: SDPA backend override (see :class:`DotProductAttention`).
        zero_centered_gamma, init_method, output_layer_init_method, params_dtype, device: as in TE.
    """

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        num_attention_heads: int,
        layernorm_epsilon: float = 1e-5,
        hidden_dropout: float = 0.0,
        attention_dropout: float = 0.0,
        kv_channels: int | None = None,
        self_attn_mask_type: str = "padding",
        *,
        normalization: str = "LayerNorm",
        activation: str = "gelu",
        bias: bool = True,
        qkv_bias: bool | None = None,
        layer_norm_position: str = "pre",
        drop_path_rate: float = 0.0,
        layer_scale_init: float | None = None,
        attention_backend: str | None = None,
        zero_centered_gamma: bool = False,
        init_method: Callable[[torch.Tensor], None] | None = None,
        output_layer_init_method: Callable[[torch.Tensor], None] | None = None,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        if layer_norm_position not in ("pre", "post"):
            raise ValueError(f"layer_norm_position must be 'pre' or 'post'; got {layer_norm_position!r}")
        for name, v in (("hidden_size", hidden_size), ("ffn_hidden_size", ffn_hidden_size), ("num_attention_heads", num_attention_heads)):
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive int; got {v!r}")
        self.hidden_size = hidden_size
        self.layer_norm_position = layer_norm_position
        pre = layer_norm_position == "pre"
        kw = {"params_dtype": params_dtype, "device": device}
        common = dict(zero_centered_gamma=zero_centered_gamma, init_method=init_method, output_layer_init_method=output_layer_init_method, **kw)
        self.self_attention = MultiheadAttention(
            hidden_size,
            num_attention_heads,
            kv_channels,
            attention_dropout,
            layernorm_epsilon,
            input_layernorm=pre,
            normalization=normalization,
            qkv_bias=bias if qkv_bias is None else qkv_bias,
            proj_bias=bias,
            attn_mask_type=self_attn_mask_type,
            backend=attention_backend,
            **common,
        )
        self.layernorm_mlp = LayerNormMLP(
            hidden_size,
            ffn_hidden_size,
            layernorm_epsilon,
            bias,
            normalization=normalization if pre else None,
            activation=activation,
            **common,
        )
        if not pre:
            self.post_attention_layernorm = make_norm(normalization, hidden_size, layernorm_epsilon, zero_centered_gamma=zero_centered_gamma, **kw)
            self.post_mlp_layernorm = make_norm(normalization, hidden_size, layernorm_epsilon, zero_centered_gamma=zero_centered_gamma, **kw)
        self.hidden_dropout = nn.Dropout(hidden_dropout)
        self.drop_path = DropPath(drop_path_rate)
        if layer_scale_init is not None:
            self.ls1 = LayerScale(hidden_size, layer_scale_init, **kw)
            self.ls2 = LayerScale(hidden_size, layer_scale_init, **kw)
        else:
            self.ls1 = self.ls2 = None

    def reset_parameters(self) -> None:
        for m in self.children():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def _branch(self, y: torch.Tensor, ls: nn.Module | None) -> torch.Tensor:
        y = self.hidden_dropout(y)
        if ls is not None:
            y = ls(y)
        return self.drop_path(y)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Args:
            hidden_states: ``[B, N, D]``.
            attention_mask: bool ``[B, N]``, True for real tokens (or a 4-d SDPA mask).

        Returns:
            ``[B, N, D]``.
        """
        if hidden_states.dim() != 3 or hidden_states.shape[-1] != self.hidden_size:
            raise ValueError(f"TransformerLayer expects hidden_states [B, N, {self.hidden_size}]; got {tuple(hidden_states.shape)}")
        x = hidden_states
        if self.layer_norm_position == "pre":
            x = x + self._branch(self.self_attention(x, attention_mask), self.ls1)
            x = x + self._branch(self.layernorm_mlp(x), self.ls2)
            return x
        x = self.post_attention_layernorm(x + self._branch(self.self_attention(x, attention_mask), self.ls1))
        x = self.post_mlp_layernorm(x + self._branch(self.layernorm_mlp(x), self.ls2))
        return x
