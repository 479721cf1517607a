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

With ``fused_kernels`` on (``Backbone(fused=True, fusion="kernels")``) a pre-norm layer runs the same
math through the hand-written kernels of :mod:`mmte.te.triton_ops` wherever they can run (CUDA; CPU
under ``TRITON_INTERPRET=1``): the attention residual add and the MLP's norm become one kernel, and
fc1's bias + activation another (fc1 runs without its bias). Where a kernel cannot run, the torch
composition runs instead, so the switch never changes results beyond fp32 reassociation.

A layer whose GEMMs are prepacked for CPU inference (:func:`mmte.te.prepack.pack`, done by
``mmte.inference.optimize``) runs the same math, when no gradient is recorded, as one flat function
over the packed weights (:meth:`TransformerLayer._forward_packed`): the activation fused into fc1's
GEMM as a oneDNN post-op, and no per-submodule dispatch. At batch 1 that dispatch is most of the
time: measured on a 2-core AVX-512-BF16 EPYC, the quickstart's 6-layer trunk on 2 tokens took about
2.7 ms this way against about 4.2 ms through the modules (its GEMMs alone about 1.6 ms).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from . import triton_ops
from .attention import MultiheadAttention, cpu_lowp_attention, use_cpu_lowp
from .layernorm_mlp import LayerNormMLP
from .lowp import LOW_PRECISION, cast_param
from .norm import apply_norm, make_norm
from .prepack import packed_gemm, packed_gemms, small_gemm

__all__ = ["DropPath", "LayerScale", "TransformerLayer"]

# activations that oneDNN applies inside fc1's GEMM on the packed path: (post-op, algorithm)
_PACKED_POSTOPS = {"gelu": ("gelu", "none"), "gelu_tanh": ("gelu", "tanh"), "relu": ("relu", "")}


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
        self.fused_kernels = False

    def kernels_apply(self) -> bool:
        """Whether :meth:`forward` can take the hand-written-kernel path for this layer's settings."""
        mlp = self.layernorm_mlp
        return (
            self.layer_norm_position == "pre"
            and mlp.up is None
            and mlp.activation in triton_ops.ACTIVATIONS
            and isinstance(mlp.norm, (nn.LayerNorm, nn.RMSNorm))
            and self.ls1 is None
            and (not self.training or (self.hidden_dropout.p == 0.0 and self.drop_path.p == 0.0))
        )

    def _forward_kernels(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        mlp = self.layernorm_mlp
        attn = self.self_attention(x, attention_mask)
        norm = mlp.norm
        zc = getattr(norm, "zero_centered_gamma", False)
        if isinstance(norm, nn.RMSNorm):
            h, x = triton_ops.fused_add_rms_norm(attn, x, norm.weight, norm.eps, zero_centered_gamma=zc)
        else:
            h, x = triton_ops.fused_add_layer_norm(attn, x, norm.weight, norm.bias, norm.eps, zero_centered_gamma=zc)
        fc1 = mlp.fc1
        if type(fc1).forward is nn.Linear.forward:  # a plain GEMM: defer its bias into the activation kernel
            a = triton_ops.bias_activation(F.linear(h, fc1.weight), fc1.bias, mlp.activation)
        else:  # e.g. an FP8 linear: keep its own GEMM (bias included)
            a = triton_ops.bias_activation(fc1(h), None, mlp.activation)
        return x + mlp.fc2(a)

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
        if not self.training and x.device.type == "cpu":
            y = self._forward_packed(x, attention_mask)
            if y is not None:
                return y
        if self.fused_kernels and self.kernels_apply():
            return self._forward_kernels(x, attention_mask)
        if self.layer_norm_position == "pre":
            x = x + self._branch(self.self_attention(x, attention_mask), self.ls1)
            x = x + self._branch(self.layernorm_mlp(x), self.ls2)
            return x
        x = self.post_attention_layernorm(x + self._branch(self.self_attention(x, attention_mask), self.ls1))
        x = self.post_mlp_layernorm(x + self._branch(self.layernorm_mlp(x), self.ls2))
        return x

    def _forward_packed(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """The layer's eval-mode math on its prepacked GEMM weights, or None where that path does not apply
        (a GEMM not packed or not a plain :class:`~mmte.te.Linear`, autograd on, another dtype).

        fp32 inputs to a low-precision (bf16) layer take the small-row path of :mod:`mmte.te.prepack`
        (fp16-packed weights, fp32 activations); inputs in the weights' dtype the oneDNN-packed GEMMs.
        The layer's own call (and its hooks) happens as usual; its GEMM modules are not called, so a GEMM
        carrying a forward hook (a LoRA adapter) sends the layer down the module path; the norms run as
        functions on their parameters (:func:`~mmte.te.norm.apply_norm`), the attention core (where a
        mask applies) as a module."""
        sub = self._modules  # plain dict lookups: at one item of a few tokens, attribute fallbacks add up
        attn, mlp = sub["self_attention"], sub["layernorm_mlp"]
        am, mm = attn._modules, mlp._modules
        qkv_m = am["layernorm_qkv"]
        up = mm.get("up")  # absent (a plain None attribute) unless the activation is gated
        mods = (qkv_m._modules["linear"], am["proj"], mm["fc1"], mm["fc2"])
        if up is not None:
            mods += (up,)
        got = packed_gemms(mods, x)
        if got is None:
            return None
        ws, bs, small = got
        b, n, d = x.shape
        pre = self.layer_norm_position == "pre"
        x = x.reshape(b * n, d)
        h = apply_norm(qkv_m._modules["norm"], x) if pre else x
        qkv = small_gemm(h, ws[0], bs[0]) if small else packed_gemm(h, ws[0], bs[0], False)
        core = am["core_attention"]
        if attention_mask is None and core.backend is None and core.attn_mask_type in ("no_mask", "padding"):
            qkv = qkv.view(b, n, -1, 3, attn.kv_channels)
            if not small and use_cpu_lowp(qkv):
                # one copy into [3, B, H, N, hd]: the batched GEMMs then read q, k, v in place (ViT-S, one
                # image: 467-549 vs 492-570 us for the attention of a layer with per-GEMM copies)
                q, k, v = qkv.permute(3, 0, 2, 1, 4).contiguous().unbind(0)
                ctx = cpu_lowp_attention(q, k, v, None, False, core.softmax_scale)
            else:
                q, k, v = qkv.transpose(1, 2).unbind(3)  # [B, H, N, hd] each
                ctx = F.scaled_dot_product_attention(q, k, v, scale=core.softmax_scale)
            ctx = ctx.transpose(1, 2)
        else:
            ctx = core(*qkv.view(b, n, -1, 3, attn.kv_channels).unbind(3), attention_mask)
        ctx = ctx.reshape(b * n, -1)
        y = small_gemm(ctx, ws[1], bs[1]) if small else packed_gemm(ctx, ws[1], bs[1], False)
        ls1, ls2 = sub.get("ls1"), sub.get("ls2")
        if ls1 is not None:
            y = ls1(y)
        x = x + y if pre else apply_norm(sub["post_attention_layernorm"], x + y)
        h = apply_norm(mm["norm"], x) if pre else x
        if small:
            a = mlp.act(small_gemm(h, ws[2], bs[2]))
            if up is not None:
                a = a * small_gemm(h, ws[4], bs[4])
            y = small_gemm(a, ws[3], bs[3])
        else:
            post = _PACKED_POSTOPS.get(mlp.activation) if up is None else None
            if post is not None:
                a = packed_gemm(h, ws[2], bs[2], False, post)
            else:
                a = mlp.act(packed_gemm(h, ws[2], bs[2], False))
                if up is not None:
                    a = a * packed_gemm(h, ws[4], bs[4], False)
            y = packed_gemm(a, ws[3], bs[3], False)
        if ls2 is not None:
            y = ls2(y)
        x = x + y if pre else apply_norm(sub["post_mlp_layernorm"], x + y)
        return x.view(b, n, d)
