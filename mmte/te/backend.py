"""The ``"te"`` backend: the same layers built from ``transformer_engine.pytorch``.

NVIDIA TransformerEngine and Moore Threads' MT-TransformerEngine (which keeps the import name) both
provide ``transformer_engine.pytorch.TransformerLayer``. :class:`TELayer` wraps one and translates state
dicts both ways, so a backbone's checkpoint keys are the same under either backend and mmte weights
(converted from timm, HF, Meta-Transformer) load into TE unchanged.

Key mapping (mmte -> TE), per layer::

    self_attention.layernorm_qkv.norm.{weight,bias} -> self_attention.layernorm_qkv.layer_norm_{weight,bias}
    self_attention.layernorm_qkv.linear.{weight,bias} -> self_attention.layernorm_qkv.{weight,bias}
    self_attention.proj.{weight,bias}                 -> self_attention.proj.{weight,bias}
    layernorm_mlp.norm.{weight,bias}                  -> layernorm_mlp.layer_norm_{weight,bias}
    layernorm_mlp.fc1 (+ up, concatenated)            -> layernorm_mlp.fc1_{weight,bias}
    layernorm_mlp.fc2.{weight,bias}                   -> layernorm_mlp.fc2_{weight,bias}

Both keep the fused QKV head-interleaved (TE's default ``qkv_weight_interleaved=True``).
What TE's layer cannot express is rejected up front: post-norm (BERT-style) layers and layer scale.
TE's ``gelu`` is the tanh approximation, so an exact-GELU model runs under TE within ~1e-3, not bit-equal.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import torch
from torch import nn

__all__ = ["TELayer", "from_te_state_dict", "te_activation", "te_available", "to_te_state_dict"]

BACKENDS = ("native", "te")

_TE_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_tanh": "gelu",
    "quick_gelu": "qgelu",
    "relu": "relu",
    "silu": "silu",
    "swiglu": "swiglu",
    "geglu": "geglu",
}

_NAME_MAP = (
    ("self_attention.layernorm_qkv.norm.weight", "self_attention.layernorm_qkv.layer_norm_weight"),
    ("self_attention.layernorm_qkv.norm.bias", "self_attention.layernorm_qkv.layer_norm_bias"),
    ("self_attention.layernorm_qkv.linear.weight", "self_attention.layernorm_qkv.weight"),
    ("self_attention.layernorm_qkv.linear.bias", "self_attention.layernorm_qkv.bias"),
    ("self_attention.proj.weight", "self_attention.proj.weight"),
    ("self_attention.proj.bias", "self_attention.proj.bias"),
    ("layernorm_mlp.norm.weight", "layernorm_mlp.layer_norm_weight"),
    ("layernorm_mlp.norm.bias", "layernorm_mlp.layer_norm_bias"),
    ("layernorm_mlp.fc2.weight", "layernorm_mlp.fc2_weight"),
    ("layernorm_mlp.fc2.bias", "layernorm_mlp.fc2_bias"),
)


@functools.cache
def te_available() -> tuple[bool, str]:
    """(True, "") when ``transformer_engine.pytorch`` imports, else (False, reason)."""
    if importlib.util.find_spec("transformer_engine") is None:
        return False, "transformer_engine is not installed (pip install 'mmte[te]' on a CUDA machine)"
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception as e:  # noqa: BLE001  # pragma: no cover - needs CUDA; any import failure means unavailable, reported
        return False, f"transformer_engine.pytorch does not import: {e}"
    return True, ""


def te_activation(name: str) -> str:
    if name not in _TE_ACTIVATIONS:
        raise ValueError(f"activation {name!r} has no TransformerEngine equivalent; expected one of {sorted(_TE_ACTIVATIONS)}")
    return _TE_ACTIVATIONS[name]


def to_te_state_dict(sd: dict[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    """Map one mmte ``TransformerLayer`` state dict (keys under ``prefix``) to TE's layout."""
    out: dict[str, torch.Tensor] = {}
    for ours, theirs in _NAME_MAP:
        if prefix + ours in sd:
            out[prefix + theirs] = sd[prefix + ours]
    fc1_w, up_w = sd.get(prefix + "layernorm_mlp.fc1.weight"), sd.get(prefix + "layernorm_mlp.up.weight")
    if fc1_w is not None:
        out[prefix + "layernorm_mlp.fc1_weight"] = fc1_w if up_w is None else torch.cat([fc1_w, up_w], 0)
    fc1_b, up_b = sd.get(prefix + "layernorm_mlp.fc1.bias"), sd.get(prefix + "layernorm_mlp.up.bias")
    if fc1_b is not None:
        out[prefix + "layernorm_mlp.fc1_bias"] = fc1_b if up_b is None else torch.cat([fc1_b, up_b], 0)
    known = {prefix + k for k, _ in _NAME_MAP} | {prefix + f"layernorm_mlp.{m}.{p}" for m in ("fc1", "up") for p in ("weight", "bias")}
    for k, v in sd.items():  # anything else (TE's _extra_state, ...) passes through unchanged
        if k.startswith(prefix) and k not in known:
            out[k] = v
    return out


def from_te_state_dict(sd: dict[str, torch.Tensor], gated: bool, prefix: str = "") -> dict[str, torch.Tensor]:
    """Inverse of :func:`to_te_state_dict` (``gated``: the MLP has an ``up`` half)."""
    out: dict[str, torch.Tensor] = {}
    for ours, theirs in _NAME_MAP:
        if prefix + theirs in sd:
            out[prefix + ours] = sd[prefix + theirs]
    for p in ("weight", "bias"):
        t = sd.get(prefix + f"layernorm_mlp.fc1_{p}")
        if t is None:
            continue
        if gated:
            a, b = t.chunk(2, 0)
            out[prefix + f"layernorm_mlp.fc1.{p}"], out[prefix + f"layernorm_mlp.up.{p}"] = a, b
        else:
            out[prefix + f"layernorm_mlp.fc1.{p}"] = t
    return out


class TELayer(nn.Module):
    """A ``transformer_engine.pytorch.TransformerLayer`` with mmte's constructor and state-dict keys.

    Same arguments as :class:`mmte.te.TransformerLayer`. Takes/returns ``[B, N, D]`` and an mmte padding
    mask (bool ``[B, N]``, True = real token), which is converted to TE's (True = masked out).
    """

    def __init__(self, hidden_size: int, ffn_hidden_size: int, num_attention_heads: int, layernorm_epsilon: float = 1e-5,
                 hidden_dropout: float = 0.0, attention_dropout: float = 0.0, kv_channels: int | None = None,
                 self_attn_mask_type: str = "padding", *, normalization: str = "LayerNorm", activation: str = "gelu",
                 bias: bool = True, qkv_bias: bool | None = None, layer_norm_position: str = "pre",
                 drop_path_rate: float = 0.0, layer_scale_init: float | None = None, params_dtype=None, device=None,
                 **unused: Any):
        super().__init__()
        ok, why = te_available()
        if not ok:
            raise RuntimeError(f"backend='te' needs TransformerEngine: {why}")
        if layer_norm_position != "pre":
            raise ValueError("backend='te' supports pre-norm layers only; got layer_norm_position='post' (use backend='native')")
        if layer_scale_init is not None:
            raise ValueError(f"backend='te' has no layer scale; got layer_scale_init={layer_scale_init} (use backend='native')")
        if qkv_bias is not None and qkv_bias != bias:
            raise ValueError(f"backend='te' uses one bias flag for all GEMMs; got bias={bias}, qkv_bias={qkv_bias}")
        import transformer_engine.pytorch as te

        self.gated = activation in ("swiglu", "geglu")
        self.layer = te.TransformerLayer(
            hidden_size, ffn_hidden_size, num_attention_heads, layernorm_epsilon=layernorm_epsilon,
            hidden_dropout=hidden_dropout, attention_dropout=attention_dropout, kv_channels=kv_channels,
            self_attn_mask_type=self_attn_mask_type, normalization=normalization, activation=te_activation(activation),
            bias=bias, drop_path_rate=drop_path_rate, fuse_qkv_params=True, qkv_weight_interleaved=True,
            attn_input_format="bshd", params_dtype=params_dtype, device=device if device is not None else "cuda",
        )
        self._register_state_dict_hook(TELayer._to_mmte)
        self._register_load_state_dict_pre_hook(TELayer._from_mmte, with_module=True)

    @staticmethod
    def _to_mmte(module, sd, prefix, local_metadata):
        p = prefix + "layer."
        sub = {k: sd.pop(k) for k in list(sd) if k.startswith(p)}
        for k, v in from_te_state_dict(sub, module.gated, p).items():
            sd[prefix + k[len(p):]] = v
        for k, v in sub.items():
            if k.endswith("_extra_state"):
                sd[prefix + k[len(p):]] = v
        return sd

    @staticmethod
    def _from_mmte(module, sd, prefix, *args):
        ours = {k: sd.pop(k) for k in list(sd) if k.startswith(prefix) and not k.startswith(prefix + "layer.")}
        for k, v in to_te_state_dict(ours, prefix).items():
            sd[prefix + "layer." + k[len(prefix):]] = v

    def reset_parameters(self) -> None:
        for m in self.layer.modules():
            if m is not self.layer and hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        te_mask = None if attention_mask is None else ~attention_mask[:, None, None, :]
        return self.layer(hidden_states, attention_mask=te_mask)
