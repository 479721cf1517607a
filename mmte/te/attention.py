"""Attention: ``DotProductAttention`` (the softmax(QK^T)V core, on PyTorch's SDPA kernels) and
``MultiheadAttention`` (fused-QKV projection + core + output projection).

Masks follow mmte's convention: a padding mask is bool ``[B, N]`` with True for a real token. The
fused QKV weight is stored head-interleaved, ``[H, 3, head_dim]`` along the output dimension (TE's
default ``qkv_weight_interleaved=True``), so a column-wise tensor-parallel split hands each rank whole
heads. Converters permute checkpoints stored as ``[3, H, head_dim]`` (timm, OpenCLIP) into it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .layernorm_linear import LayerNormLinear
from .linear import Linear

__all__ = ["ATTN_MASK_TYPES", "DotProductAttention", "MultiheadAttention", "cpu_lowp_attention", "expand_padding_mask", "use_cpu_lowp"]

ATTN_MASK_TYPES = ("no_mask", "padding", "causal", "padding_causal")

_SDPA_BACKENDS = {
    "math": "MATH",
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
}


def expand_padding_mask(mask: torch.Tensor, batch: int, q_len: int, k_len: int) -> torch.Tensor:
    """Turn a padding mask into SDPA's ``attn_mask``.

    Accepts bool ``[B, Nk]`` (True = real token) -> bool ``[B, 1, 1, Nk]``; a 4-d bool or float mask
    broadcastable to ``[B, H, Nq, Nk]`` passes through. Anything else raises ``ValueError``.
    """
    if mask.dim() == 2:
        if mask.dtype != torch.bool:
            raise ValueError(f"a padding mask must be bool [B, N] (True = real token); got dtype {mask.dtype}")
        if tuple(mask.shape) != (batch, k_len):
            raise ValueError(f"padding mask must have shape (B, N) = {(batch, k_len)}; got {tuple(mask.shape)}")
        return mask[:, None, None, :]
    if mask.dim() == 4:
        if mask.shape[0] not in (1, batch) or mask.shape[-2] not in (1, q_len) or mask.shape[-1] != k_len:
            raise ValueError(
                f"4-d attention mask must broadcast to (B, H, Nq, Nk) = ({batch}, H, {q_len}, {k_len}); got {tuple(mask.shape)}"
            )
        return mask
    raise ValueError(f"attention mask must be [B, N] or [B, H, Nq, Nk]; got shape {tuple(mask.shape)}")


def cpu_lowp_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """``softmax(q k^T * scale + mask) v`` as two batched GEMMs and a softmax, for bf16/fp16 on CPUs.

    The softmax kernel computes its max and sum in fp32 internally and rounds the probabilities to the
    input dtype for the second GEMM, as the fused kernels do. Masked scores are set to the dtype's
    lowest finite value (a row with every key masked attends uniformly instead of producing NaN).

    Args:
        q, k, v: ``[B, H, N, head_dim]``.
        mask: bool (True = attend) or additive float, broadcastable to ``[B, H, Nq, Nk]``; or None.
        causal: also mask keys after each query (bottom-right aligned, as SDPA).
        scale: multiplier of the scores.
        dropout_p: dropout on the probabilities.

    Returns:
        ``[B, H, Nq, head_dim]``.
    """
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
    if causal:
        nq, nk = scores.shape[-2:]
        tri = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(nk - nq)
        mask = tri if mask is None else (mask & tri if mask.dtype == torch.bool else mask.masked_fill(~tri, float("-inf")))
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + mask.to(scores.dtype).clamp_min(torch.finfo(scores.dtype).min)
    probs = scores.softmax(-1)
    if dropout_p > 0.0:
        probs = F.dropout(probs, dropout_p)
    return torch.matmul(probs, v)


# Below this many query rows (batch x heads x tokens) SDPA's fused CPU kernel beats the two bf16 GEMMs:
# their per-call set-up dominates tiny problems.
_LOWP_MIN_ROWS = 512


def use_cpu_lowp(q: torch.Tensor) -> bool:
    """Whether :class:`DotProductAttention` runs ``q`` (``[B, H, N, head_dim]``) through :func:`cpu_lowp_attention`."""
    if q.device.type != "cpu" or q.dtype not in (torch.bfloat16, torch.float16) or torch.compiler.is_compiling():
        return False
    return q.shape[0] * q.shape[1] * q.shape[2] >= _LOWP_MIN_ROWS


class DotProductAttention(nn.Module):
    """``softmax(Q K^T * scale + mask) V`` on ``torch.nn.functional.scaled_dot_product_attention``.

    Args:
        num_attention_heads: number of heads ``H`` (the local count under tensor parallelism is read
            from the inputs, so the module is TP-agnostic).
        kv_channels: head size.
        attention_dropout: dropout on the attention probabilities (training only).
        attn_mask_type: ``"no_mask"``, ``"padding"``, ``"causal"`` or ``"padding_causal"``.
        softmax_scale: default ``1/sqrt(kv_channels)``.
        backend: force an SDPA backend (``"math"``, ``"flash"``, ``"efficient"``, ``"cudnn"``); default
            ``None`` lets PyTorch choose per device (flash / memory-efficient / cuDNN on GPUs, the fused
            CPU kernel on CPUs) — except bf16/fp16 on a CPU with at least 512 query rows (batch x
            heads x tokens), which runs :func:`cpu_lowp_attention` (two batched GEMMs around a
            softmax), because the CPU flash kernel's backward is not bf16-optimised; below 512 rows the
            fused kernel is faster (figures: BENCHMARKS.md, docs/experiments/).

    Inputs are ``[B, N, H, head_dim]`` (TE's ``bshd``); the output is ``[B, N, H * head_dim]``.
    """

    def __init__(
        self,
        num_attention_heads: int,
        kv_channels: int,
        attention_dropout: float = 0.0,
        attn_mask_type: str = "no_mask",
        softmax_scale: float | None = None,
        backend: str | None = None,
    ):
        super().__init__()
        if attn_mask_type not in ATTN_MASK_TYPES:
            raise ValueError(f"attn_mask_type must be one of {ATTN_MASK_TYPES}; got {attn_mask_type!r}")
        if backend is not None and backend not in _SDPA_BACKENDS:
            raise ValueError(f"backend must be one of {sorted(_SDPA_BACKENDS)} or None; got {backend!r}")
        self.num_attention_heads = num_attention_heads
        self.kv_channels = kv_channels
        self.attention_dropout = attention_dropout
        self.attn_mask_type = attn_mask_type
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(kv_channels)
        self.backend = backend

    def _kernel_ctx(self):
        if self.backend is None:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(getattr(SDPBackend, _SDPA_BACKENDS[self.backend]))

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if query.dim() != 4 or query.shape[-1] != self.kv_channels:
            raise ValueError(f"DotProductAttention expects [B, N, H, {self.kv_channels}] inputs; got {tuple(query.shape)}")
        b, nq = query.shape[:2]
        nk = key.shape[1]
        causal = self.attn_mask_type in ("causal", "padding_causal")
        mask = None
        if attention_mask is not None:
            mask = expand_padding_mask(attention_mask, b, nq, nk)
            if causal:  # SDPA cannot combine is_causal with a mask: build the joint mask
                tri = torch.ones(nq, nk, dtype=torch.bool, device=query.device).tril(nk - nq)
                mask = (mask if mask.dtype == torch.bool else mask > -1e30) & tri
                causal = False
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))
        dropout_p = self.attention_dropout if self.training else 0.0
        if self.backend is None and use_cpu_lowp(q):
            out = cpu_lowp_attention(q, k, v, mask, causal, self.softmax_scale, dropout_p)
            return out.transpose(1, 2).flatten(2)
        with self._kernel_ctx():
            out = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                dropout_p=dropout_p,
                is_causal=causal,
                scale=self.softmax_scale,
            )
        return out.transpose(1, 2).flatten(2)


class MultiheadAttention(nn.Module):
    """Self-attention with a fused, head-interleaved QKV projection.

    Args:
        hidden_size: model width ``D``.
        num_attention_heads: ``H``; ``kv_channels`` defaults to ``D // H``.
        attention_dropout: probability dropout.
        layernorm_epsilon: epsilon of the input norm.
        input_layernorm: normalise the input inside the QKV GEMM module (pre-norm); False for post-norm.
        normalization: ``"LayerNorm"`` or ``"RMSNorm"``.
        qkv_bias, proj_bias: biases of the two GEMMs.
        attn_mask_type, softmax_scale, backend: see :class:`DotProductAttention`.

    Submodules (stable names): ``layernorm_qkv`` (``.norm``, ``.linear``), ``core_attention``, ``proj``.
    """

    def __init__(
        self,
        hidden_size: int,
        num_attention_heads: int,
        kv_channels: int | None = None,
        attention_dropout: float = 0.0,
        layernorm_epsilon: float = 1e-5,
        *,
        input_layernorm: bool = True,
        normalization: str = "LayerNorm",
        qkv_bias: bool = True,
        proj_bias: bool = True,
        attn_mask_type: str = "no_mask",
        softmax_scale: float | None = None,
        backend: str | None = None,
        zero_centered_gamma: bool = False,
        init_method: Callable[[torch.Tensor], None] | None = None,
        output_layer_init_method: Callable[[torch.Tensor], None] | None = None,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        if kv_channels is None:
            if hidden_size % num_attention_heads:
                raise ValueError(
                    f"hidden_size ({hidden_size}) must be divisible by num_attention_heads ({num_attention_heads})"
                )
            kv_channels = hidden_size // num_attention_heads
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.kv_channels = kv_channels
        inner = num_attention_heads * kv_channels
        kw = {"params_dtype": params_dtype, "device": device}
        self.layernorm_qkv = LayerNormLinear(
            hidden_size,
            3 * inner,
            layernorm_epsilon,
            qkv_bias,
            normalization=normalization if input_layernorm else None,
            zero_centered_gamma=zero_centered_gamma,
            init_method=init_method,
            **kw,
        )
        self.core_attention = DotProductAttention(
            num_attention_heads, kv_channels, attention_dropout, attn_mask_type, softmax_scale, backend
        )
        self.proj = Linear(inner, hidden_size, proj_bias, init_method=output_layer_init_method or init_method, **kw)

    def reset_parameters(self) -> None:
        self.layernorm_qkv.reset_parameters()
        self.proj.reset_parameters()

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        qkv = self.layernorm_qkv(hidden_states)
        b, n, _ = qkv.shape
        # [B, N, H_local, 3, hd]: the local head count follows the (possibly TP-sharded) GEMM output
        qkv = qkv.view(b, n, -1, 3, self.kv_channels)
        q, k, v = qkv.unbind(dim=3)
        ctx = self.core_attention(q, k, v, attention_mask)
        return self.proj(ctx)
