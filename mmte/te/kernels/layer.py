"""``KernelTransformerLayer``: a pre-norm :class:`~mmte.te.TransformerLayer` run through the kernels.

:func:`use_kernels` swaps it in for every layer whose settings the kernels cover (what
``Backbone(fused=True, fusion="kernels")`` does): the attention residual add and the MLP's norm become
one kernel (:func:`~mmte.te.kernels.fused_add_layer_norm` / ``fused_add_rms_norm``), and fc1's bias +
activation another (:func:`~mmte.te.kernels.bias_activation`). Parameters, buffers and FQNs are the
layer's own (the swap changes the class only), so state dicts and checkpoints are unchanged. Where a
kernel cannot run the torch composition runs instead, so the swap never changes results beyond fp32
reassociation.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from ..transformer import TransformerLayer
from .ops import ACTIVATIONS, bias_activation, fused_add_layer_norm, fused_add_rms_norm

logger = logging.getLogger(__name__)

__all__ = ["KernelTransformerLayer", "kernels_apply", "use_kernels"]


def kernels_apply(layer: TransformerLayer) -> bool:
    """Whether the kernels cover ``layer``'s settings: pre-norm, a non-gated activation they implement,
    a plain LayerNorm/RMSNorm before the MLP and no layer scale."""
    mlp = layer.layernorm_mlp
    return (
        layer.layer_norm_position == "pre"
        and mlp.up is None
        and mlp.activation in ACTIVATIONS
        and isinstance(mlp.norm, (nn.LayerNorm, nn.RMSNorm))
        and layer.ls1 is None
    )


class KernelTransformerLayer(TransformerLayer):
    """A pre-norm :class:`~mmte.te.TransformerLayer` whose residual add + MLP norm and fc1 bias +
    activation run as fused kernels. Built by :func:`use_kernels` from a layer that
    :func:`kernels_apply` accepts; the same arguments and FQNs as its base."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Args and returns as :meth:`TransformerLayer.forward`. Training with dropout or drop path on
        runs the base layer's forward: the kernels implement neither."""
        if self.training and (self.hidden_dropout.p != 0.0 or self.drop_path.p != 0.0):
            return super().forward(hidden_states, attention_mask)
        if hidden_states.dim() != 3 or hidden_states.shape[-1] != self.hidden_size:
            raise ValueError(f"TransformerLayer expects hidden_states [B, N, {self.hidden_size}]; got {tuple(hidden_states.shape)}")
        x = hidden_states
        mlp = self.layernorm_mlp
        attn = self.self_attention(x, attention_mask)
        norm = mlp.norm
        zc = getattr(norm, "zero_centered_gamma", False)
        if isinstance(norm, nn.RMSNorm):
            h, x = fused_add_rms_norm(attn, x, norm.weight, norm.eps, zero_centered_gamma=zc)
        else:
            h, x = fused_add_layer_norm(attn, x, norm.weight, norm.bias, norm.eps, zero_centered_gamma=zc)
        # fc1 keeps its own GEMM and bias (an FP8 or LoRA-hooked linear stays what it is); the kernel
        # applies the activation
        a = bias_activation(mlp.fc1(h), None, mlp.activation)
        return x + mlp.fc2(a)


def use_kernels(module: nn.Module) -> int:
    """Swap :class:`KernelTransformerLayer` in for every plain :class:`~mmte.te.TransformerLayer` in
    ``module`` that :func:`kernels_apply` accepts (in place); returns how many were swapped."""
    layers = [m for m in module.modules() if type(m) is TransformerLayer]
    n = 0
    for m in layers:
        if kernels_apply(m):
            m.__class__ = KernelTransformerLayer
            n += 1
    logger.info("swapped %d/%d transformer layers to hand-written kernels (add+norm, bias+activation)", n, len(layers))
    return n
