"""Naive pure-PyTorch references for mmte.te, written from the textbook formulas (explicit mean/var,
explicit softmax, erf GELU), with their own weight layout (separate q, k, v)."""

from __future__ import annotations

import math

import torch


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    y = (x - mu) / torch.sqrt(var + eps)
    return y * w + (b if b is not None else 0)


def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def act(name, x):
    if name == "gelu":
        return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    if name == "gelu_tanh":
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    if name == "quick_gelu":
        return x / (1 + torch.exp(-1.702 * x))
    if name == "relu":
        return torch.where(x > 0, x, torch.zeros_like(x))
    if name == "silu":
        return x / (1 + torch.exp(-x))
    raise ValueError(name)


def linear(x, w, b=None):
    y = torch.einsum("...i,oi->...o", x, w)
    return y + b if b is not None else y


def attention(q, k, v, mask=None, causal=False):
    """q, k, v: [B, H, N, hd]; mask: bool [B, N] (True = real key)."""
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
    allowed = torch.ones(scores.shape[-2:], dtype=torch.bool)
    if causal:
        allowed = torch.tril(allowed)
    allowed = allowed[None, None]
    if mask is not None:
        allowed = allowed & mask[:, None, None, :]
    scores = scores.masked_fill(~allowed, float("-inf"))
    p = torch.exp(scores - scores.amax(-1, keepdim=True))
    p = p / p.sum(-1, keepdim=True)
    return torch.einsum("bhqk,bhkd->bhqd", p, v)


def split_qkv(w_interleaved, heads):
    """mmte's head-interleaved [H, 3, hd] rows -> (q, k, v) each [H*hd, ...]."""
    t = w_interleaved.reshape(heads, 3, -1, *w_interleaved.shape[1:])
    return [t[:, i].reshape(-1, *w_interleaved.shape[1:]) for i in range(3)]


def mha(x, p, heads, mask=None, causal=False, prefix="self_attention."):
    """Multi-head self-attention from a state dict ``p`` (mmte keys, norm excluded)."""
    b, n, _d = x.shape
    wq, wk, wv = split_qkv(p[prefix + "layernorm_qkv.linear.weight"], heads)
    bias = p.get(prefix + "layernorm_qkv.linear.bias")
    bq, bk, bv = split_qkv(bias, heads) if bias is not None else (None, None, None)
    q, k, v = (linear(x, w, bb).reshape(b, n, heads, -1).transpose(1, 2) for w, bb in ((wq, bq), (wk, bk), (wv, bv)))
    o = attention(q, k, v, mask, causal).transpose(1, 2).reshape(b, n, -1)
    return linear(o, p[prefix + "proj.weight"], p.get(prefix + "proj.bias"))


def mlp(x, p, activation, prefix="layernorm_mlp."):
    h = linear(x, p[prefix + "fc1.weight"], p.get(prefix + "fc1.bias"))
    if activation in ("swiglu", "geglu"):
        h = act("silu" if activation == "swiglu" else "gelu", h) * linear(x, p[prefix + "up.weight"], p.get(prefix + "up.bias"))
    else:
        h = act(activation, h)
    return linear(h, p[prefix + "fc2.weight"], p.get(prefix + "fc2.bias"))


def norm(x, p, name, eps, kind="LayerNorm"):
    if kind == "RMSNorm":
        return rms_norm(x, p[name + ".weight"], eps)
    return layer_norm(x, p[name + ".weight"], p.get(name + ".bias"), eps)


def transformer_layer(x, p, heads, *, eps, activation="gelu", position="pre", mask=None, causal=False, kind="LayerNorm"):
    """One layer from mmte's state dict ``p`` (eval mode: no dropout / drop path)."""
    ls1 = p.get("ls1.gamma", 1.0)
    ls2 = p.get("ls2.gamma", 1.0)
    if position == "pre":
        x = x + ls1 * mha(norm(x, p, "self_attention.layernorm_qkv.norm", eps, kind), p, heads, mask, causal)
        x = x + ls2 * mlp(norm(x, p, "layernorm_mlp.norm", eps, kind), p, activation)
        return x
    x = norm(x + ls1 * mha(x, p, heads, mask, causal), p, "post_attention_layernorm", eps, kind)
    return norm(x + ls2 * mlp(x, p, activation), p, "post_mlp_layernorm", eps, kind)
