"""``PackedTransformerLayer``: a :class:`~mmte.te.TransformerLayer` whose eval-mode math runs as one flat
function over its prepacked GEMM weights.

At one item of a few tokens the per-submodule dispatch of a layer (about 19 module calls) costs more
than its arithmetic. The flat forward runs the same math without it: GEMMs on the packings of its
:class:`~mmte.inference.prepack.PackedLinear` modules, the activation fused into fc1's GEMM as a oneDNN
post-op where oneDNN has it, the norms as functions on their parameters (:func:`apply_norm`), and the
attention core as a module only where a mask or backend override needs it. fp32 inputs to a bf16 layer
take the small-row path (fp16-packed weights, fp32 activations); inputs in the weights' dtype the
oneDNN-packed GEMMs.

Where the flat path does not apply (a GEMM not packed or carrying forward hooks, such as a LoRA
adapter's; global module hooks; autograd on; another dtype or device), the layer runs its base forward,
whose packed GEMM modules still use their packings where they can. Submodules are read from the
``_modules`` dict directly: at this size nn.Module's attribute fallback is a measurable share of a call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..te.attention import cpu_lowp_attention, use_cpu_lowp
from ..te.norm import LayerNorm, RMSNorm
from ..te.transformer import TransformerLayer
from .prepack import global_hooks, packed_gemm, packed_gemms, small_gemm

__all__ = ["PackedTransformerLayer", "apply_norm"]

# activations that oneDNN applies inside fc1's GEMM on the packed path: (post-op, algorithm)
_PACKED_POSTOPS = {"gelu": ("gelu", "none"), "gelu_tanh": ("gelu", "tanh"), "relu": ("relu", "")}


def apply_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)``, as one functional call for an unhooked :class:`~mmte.te.LayerNorm`/:class:`~mmte.te.RMSNorm`
    whose parameters are in ``x``'s dtype (or LayerNorm's CPU kernel case: fp32 gamma, bf16 ``x``); any
    other norm through its call."""
    cls = type(norm)
    if (cls is LayerNorm or cls is RMSNorm) and not (norm._forward_hooks or norm._forward_pre_hooks or global_hooks()):
        params = norm._parameters
        w = params["weight"]
        if w is not None and (w.dtype == x.dtype or (cls is LayerNorm and x.device.type == "cpu")):
            if norm.zero_centered_gamma:
                w = w + 1
            if cls is LayerNorm:
                return F.layer_norm(x, norm.normalized_shape, w, params["bias"], norm.eps)
            return F.rms_norm(x, norm.normalized_shape, w, norm.eps)
    return norm(x)


class PackedTransformerLayer(TransformerLayer):
    """A :class:`~mmte.te.TransformerLayer` with prepacked GEMMs, run as one flat function in eval mode
    on CPUs. Made in place by :func:`mmte.inference.pack` (the class is swapped; parameters, hooks and
    FQNs stay)."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Args and returns as :meth:`TransformerLayer.forward`."""
        if not self.training and hidden_states.device.type == "cpu" and hidden_states.dim() == 3:
            y = self._flat(hidden_states, attention_mask)
            if y is not None:
                return y
        return super().forward(hidden_states, attention_mask)

    def _flat(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """The layer's eval-mode math on its packed GEMM weights, or None where that path does not apply."""
        sub = self._modules
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
        if d != self.hidden_size:
            return None  # the base forward raises the shape error
        if small and torch.is_autocast_enabled("cpu"):
            # the small-row path keeps its activations in fp32 (fp16-packed weights); an autocast region around
            # the copy (bf16-mixed prediction) would hand its GEMMs bf16 attention outputs
            with torch.autocast("cpu", enabled=False):
                return self._flat(x, attention_mask)
        pre = self.layer_norm_position == "pre"
        x = x.reshape(b * n, d)
        h = apply_norm(qkv_m._modules["norm"], x) if pre else x
        qkv = small_gemm(h, ws[0], bs[0]) if small else packed_gemm(h, ws[0], bs[0], False)
        core = am["core_attention"]
        if attention_mask is None and core.backend is None and core.attn_mask_type in ("no_mask", "padding"):
            qkv = qkv.view(b, n, -1, 3, attn.kv_channels)
            if not small and use_cpu_lowp(qkv):
                # one copy into [3, B, H, N, hd]: the batched GEMMs then read q, k, v in place
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
