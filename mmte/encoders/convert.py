"""State-dict adapters: timm ViT, OpenCLIP and the Meta-Transformer encoder release -> mmte (Hugging Face
models: :mod:`mmte.encoders.convert_hf`, on the same helpers).

All of them go through one per-layer description (:class:`_Layer`) so the permutation of the fused QKV
(checkpoints store ``[3, H, hd]``; mmte stores head-interleaved ``[H, 3, hd]``) and the pre/post-norm
placement live in one place. Loading is strict: a missing or unexpected key, or a tensor of another
shape, raises ``ValueError`` listing them.

Files are read with safetensors or ``torch.load(weights_only=True)``, never plain pickle.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

import torch
from torch import nn

from ..tokenizers.image import ImageTokenizer
from .backbone import Backbone
from .encoder import Encoder
from .presets import BackboneConfig, get_preset

logger = logging.getLogger(__name__)

__all__ = [
    "Encoder",
    "deinterleave_qkv",
    "from_timm",
    "interleave_qkv",
    "load_meta_transformer",
    "load_state_dict_file",
    "load_strict",
    "meta_transformer_to_mmte",
    "open_clip_to_mmte",
]

Tensor = torch.Tensor


# ----------------------------------------------------------------------------------------------- utils
def interleave_qkv(t: Tensor, num_heads: int) -> Tensor:
    """``[3*H*hd, ...]`` stored as (q, k, v) blocks -> head-interleaved ``[H, 3, hd]`` rows."""
    rest = t.shape[1:]
    return t.reshape(3, num_heads, -1, *rest).transpose(0, 1).reshape(t.shape)


def deinterleave_qkv(t: Tensor, num_heads: int) -> Tensor:
    """Inverse of :func:`interleave_qkv`."""
    rest = t.shape[1:]
    return t.reshape(num_heads, 3, -1, *rest).transpose(0, 1).reshape(t.shape)


def load_state_dict_file(path: str | os.PathLike, check_finite: bool = True) -> dict[str, Tensor]:
    """Read a checkpoint safely: ``.safetensors`` via safetensors, else ``torch.load(weights_only=True)``.

    A wrapper dict (``{"state_dict": ...}``, ``{"model": ...}``, ``{"module": ...}``) is unwrapped.

    Raises:
        FileNotFoundError: no such file.
        mmte.errors.UsageError: the file is malformed or truncated, or holds no state dict (the file named).
        mmte.errors.NonFiniteError: with ``check_finite``, a floating tensor holds NaN/inf (file and tensor named).
    """
    from ..errors import NonFiniteError, UsageError

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint file not found: {path}")
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            sd = load_file(path)
        else:
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - every reader error means the file cannot be used
        first = (str(e).strip().splitlines() or [""])[0][:160]
        kind = "safetensors" if path.endswith(".safetensors") else "torch.save"
        raise UsageError(f"weights file {path} is malformed or truncated ({type(e).__name__}: {first})",
                         f"expected a complete {kind} file of tensors", "replace it (e.g. write it again with mmte convert)") from None
    for key in ("state_dict", "model", "module"):
        if isinstance(sd, dict) and key in sd and isinstance(sd[key], dict):
            sd = sd[key]
    if not isinstance(sd, dict):
        raise UsageError(f"{path} does not hold a state dict (got {type(sd).__name__})", "expected a mapping of names to tensors",
                         "point at a weights file")
    if check_finite:
        for k, t in sd.items():
            if isinstance(t, Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
                bad = ~torch.isfinite(t)
                i = int(bad.reshape(-1).nonzero()[0, 0])
                raise NonFiniteError(
                    f"weights file {path}: tensor {k!r} {list(t.shape)} holds {int(bad.sum())} non-finite value(s) (first: "
                    f"{t.reshape(-1)[i].item()} at flat index {i})",
                    "expected finite weights", "use an intact copy of the weights",
                )
    return sd


def load_strict(module: nn.Module, sd: dict[str, Tensor], what: str) -> None:
    """``module.load_state_dict(sd)`` that names every missing/unexpected key and shape mismatch."""
    own = module.state_dict()
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    shapes = [f"{k}: expected {tuple(own[k].shape)}, got {tuple(sd[k].shape)}" for k in own if k in sd and own[k].shape != sd[k].shape]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing keys {missing}")
        if unexpected:
            parts.append(f"unexpected keys {unexpected}")
        if shapes:
            parts.append("shape mismatches [" + "; ".join(shapes) + "]")
        raise ValueError(f"cannot load {what}: " + ", ".join(parts))
    module.load_state_dict(sd, strict=True)


@dataclass
class _Layer:
    """One transformer layer's tensors in checkpoint-neutral names (qkv in (q, k, v) block order)."""

    qkv_w: Tensor
    qkv_b: Tensor | None
    proj_w: Tensor
    proj_b: Tensor | None
    norm1: tuple[Tensor, Tensor]
    norm2: tuple[Tensor, Tensor]
    fc1_w: Tensor
    fc1_b: Tensor | None
    fc2_w: Tensor
    fc2_b: Tensor | None
    ls1: Tensor | None = None
    ls2: Tensor | None = None

    def to_mmte(self, i: int, num_heads: int, post_norm: bool) -> dict[str, Tensor]:
        p = f"layers.{i}."
        out = {
            p + "self_attention.layernorm_qkv.linear.weight": interleave_qkv(self.qkv_w, num_heads),
            p + "self_attention.proj.weight": self.proj_w,
            p + "layernorm_mlp.fc1.weight": self.fc1_w,
            p + "layernorm_mlp.fc2.weight": self.fc2_w,
        }
        for k, v in (
            ("self_attention.layernorm_qkv.linear.bias", None if self.qkv_b is None else interleave_qkv(self.qkv_b, num_heads)),
            ("self_attention.proj.bias", self.proj_b),
            ("layernorm_mlp.fc1.bias", self.fc1_b),
            ("layernorm_mlp.fc2.bias", self.fc2_b),
            ("ls1.gamma", self.ls1),
            ("ls2.gamma", self.ls2),
        ):
            if v is not None:
                out[p + k] = v
        n1, n2 = ("post_attention_layernorm", "post_mlp_layernorm") if post_norm else ("self_attention.layernorm_qkv.norm", "layernorm_mlp.norm")
        for name, (w, b) in ((n1, self.norm1), (n2, self.norm2)):
            out[p + name + ".weight"], out[p + name + ".bias"] = w, b
        return out


def _cat_qkv(sd: dict[str, Tensor], q: str, k: str, v: str, suffix: str) -> Tensor | None:
    if q + suffix not in sd:
        return None
    return torch.cat([sd[q + suffix], sd[k + suffix], sd[v + suffix]], 0)


def _pop_prefix(sd: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)} if prefix else dict(sd)


def _num_layers(sd: dict[str, Tensor], pattern: str) -> int:
    idx = {int(m.group(1)) for k in sd for m in [re.match(pattern, k)] if m}
    if not idx:
        raise ValueError(f"no transformer layers found (keys matching {pattern!r})")
    if idx != set(range(len(idx))):
        raise ValueError(f"layer indices are not contiguous from 0: {sorted(idx)}")
    return len(idx)


def _norm(sd: dict[str, Tensor], name: str) -> tuple[Tensor, Tensor]:
    return sd[name + ".weight"], sd[name + ".bias"]


def _activation_name(act: nn.Module) -> str:
    name = type(act).__name__
    if name == "GELU":
        return "gelu_tanh" if getattr(act, "approximate", "none") == "tanh" else "gelu"
    if name in ("QuickGELU", "QuickGELUActivation"):
        return "quick_gelu"
    if name in ("SiLU", "SiLUActivation"):
        return "silu"
    if name == "ReLU":
        return "relu"
    raise ValueError(f"unsupported MLP activation {name}; expected GELU, QuickGELU, SiLU or ReLU")


_HF_ACT = {"gelu": "gelu", "quick_gelu": "quick_gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu", "silu": "silu"}


def _hf_act(name: str) -> str:
    if name not in _HF_ACT:
        raise ValueError(f"unsupported hidden_act {name!r}; expected one of {sorted(_HF_ACT)}")
    return _HF_ACT[name]


def _build(config: BackboneConfig, layers: list[_Layer], extra: dict[str, Tensor], fused: bool, what: str) -> Backbone:
    backbone = Backbone(config)
    sd = dict(extra)
    for i, layer in enumerate(layers):
        sd.update(layer.to_mmte(i, config.num_attention_heads, config.layer_norm_position == "post"))
    load_strict(backbone, sd, what)
    if fused:
        backbone.fuse()
    return backbone


# -------------------------------------------------------------------------------------- timm / OpenCLIP
def _timm_layers(sd: dict[str, Tensor], n: int) -> list[_Layer]:
    out = []
    for i in range(n):
        p = f"blocks.{i}."
        out.append(
            _Layer(
                sd[p + "attn.qkv.weight"],
                sd.get(p + "attn.qkv.bias"),
                sd[p + "attn.proj.weight"],
                sd.get(p + "attn.proj.bias"),
                _norm(sd, p + "norm1"),
                _norm(sd, p + "norm2"),
                sd[p + "mlp.fc1.weight"],
                sd.get(p + "mlp.fc1.bias"),
                sd[p + "mlp.fc2.weight"],
                sd.get(p + "mlp.fc2.bias"),
                sd.get(p + "ls1.gamma"),
                sd.get(p + "ls2.gamma"),
            )
        )
    return out


def from_timm(model: nn.Module, *, fused: bool = False) -> Encoder:
    """Convert a timm ``VisionTransformer`` (plain, CLIP with ``norm_pre``, layer scale, register
    tokens, ``no_embed_class``) into an :class:`Encoder` whose ``forward_features(images)`` equals
    ``model.forward_features(images)``.

    Raises:
        ValueError: for a feature mmte's backbone does not express (qk-norm, MLP norm, patch norm, ...),
            naming it.
    """
    for attr in ("patch_embed", "blocks", "pos_embed"):
        if not hasattr(model, attr):
            raise ValueError(f"from_timm expects a timm VisionTransformer; {type(model).__name__} has no {attr!r}")
    blk = model.blocks[0]
    unsupported = [
        name
        for name, mod in (
            ("attn.q_norm", getattr(blk.attn, "q_norm", None)),
            ("attn.k_norm", getattr(blk.attn, "k_norm", None)),
            ("attn.norm", getattr(blk.attn, "norm", None)),
            ("mlp.norm", getattr(blk.mlp, "norm", None)),
            ("patch_embed.norm", getattr(model.patch_embed, "norm", None)),
        )
        if mod is not None and not isinstance(mod, nn.Identity)
    ]
    if unsupported:
        raise ValueError(f"timm model uses {unsupported}, which mmte's TransformerLayer does not implement")
    if type(blk).__name__ != "Block":
        raise ValueError(f"from_timm supports timm's standard ViT Block; got {type(blk).__name__}")
    sd = model.state_dict()
    n = len(model.blocks)
    norm_pre = not isinstance(model.norm_pre, nn.Identity)
    final_norm = not isinstance(model.norm, nn.Identity)
    d = model.embed_dim
    config = BackboneConfig(
        num_layers=n,
        hidden_size=d,
        num_attention_heads=blk.attn.num_heads,
        ffn_hidden_size=blk.mlp.fc1.out_features,
        activation=_activation_name(blk.mlp.act),
        layernorm_epsilon=blk.norm1.eps,
        qkv_bias=blk.attn.qkv.bias is not None,
        bias=blk.attn.proj.bias is not None,
        pre_norm=norm_pre,
        final_norm=final_norm,
        layer_scale_init=1.0 if "blocks.0.ls1.gamma" in sd else None,
    )
    extra = {}
    if norm_pre:
        extra.update({"norm_pre.weight": sd["norm_pre.weight"], "norm_pre.bias": sd["norm_pre.bias"]})
    if final_norm:
        extra.update({"norm.weight": sd["norm.weight"], "norm.bias": sd["norm.bias"]})
    backbone = _build(config, _timm_layers(sd, n), extra, fused, "timm ViT blocks")
    pe = model.patch_embed
    cls = getattr(model, "cls_token", None) is not None
    tok = ImageTokenizer(
        d,
        tuple(pe.img_size),
        tuple(pe.patch_size),
        pe.proj.in_channels,
        cls_token=cls,
        num_reg_tokens=getattr(model, "num_reg_tokens", 0),
        pos_embed=model.pos_embed is not None,
        no_embed_class=getattr(model, "no_embed_class", False),
        patch_bias=pe.proj.bias is not None,
        dynamic_img_size=True,
    )
    tsd = {"proj.weight": sd["patch_embed.proj.weight"]}
    for ours, theirs in (("proj.bias", "patch_embed.proj.bias"), ("cls_token", "cls_token"), ("reg_token", "reg_token"), ("pos_embed", "pos_embed")):
        if theirs in sd:
            tsd[ours] = sd[theirs]
    load_strict(tok, tsd, "timm patch embedding")
    logger.info("converted timm %s: %d layers, width %d", type(model).__name__, n, d)
    return Encoder(tok, backbone)


def open_clip_to_mmte(
    state_dict: dict[str, Tensor] | str | os.PathLike,
    *,
    num_heads: int | None = None,
    activation: str = "gelu",
    layernorm_epsilon: float = 1e-5,
    fused: bool = False,
) -> Encoder:
    """Convert an OpenCLIP / OpenAI-CLIP visual tower (``conv1``, ``class_embedding``,
    ``positional_embedding``, ``ln_pre``, ``transformer.resblocks.{i}``, ``ln_post``; a ``visual.``
    prefix is stripped) into an :class:`Encoder` returning the ``ln_post``-normalised tokens.

    Args:
        num_heads: attention heads (default: width // 64, the CLIP convention).
        activation: ``"quick_gelu"`` for OpenAI's weights, ``"gelu"`` for OpenCLIP-trained ones.
    """
    sd = load_state_dict_file(state_dict) if isinstance(state_dict, (str, os.PathLike)) else dict(state_dict)
    if any(k.startswith("visual.") for k in sd):
        sd = _pop_prefix(sd, "visual.")
    if "conv1.weight" not in sd:
        raise ValueError("not an OpenCLIP visual state dict: no 'conv1.weight' (keys start with " + str(sorted(sd)[:5]) + ")")
    n = _num_layers(sd, r"transformer\.resblocks\.(\d+)\.")
    conv = sd["conv1.weight"]
    d, in_chans, patch = conv.shape[0], conv.shape[1], conv.shape[-1]
    heads = num_heads or max(d // 64, 1)
    layers = []
    for i in range(n):
        p = f"transformer.resblocks.{i}."
        layers.append(
            _Layer(
                sd[p + "attn.in_proj_weight"],
                sd.get(p + "attn.in_proj_bias"),
                sd[p + "attn.out_proj.weight"],
                sd.get(p + "attn.out_proj.bias"),
                _norm(sd, p + "ln_1"),
                _norm(sd, p + "ln_2"),
                sd[p + "mlp.c_fc.weight"],
                sd.get(p + "mlp.c_fc.bias"),
                sd[p + "mlp.c_proj.weight"],
                sd.get(p + "mlp.c_proj.bias"),
            )
        )
    config = BackboneConfig(
        n, d, heads, layers[0].fc1_w.shape[0], activation=activation, layernorm_epsilon=layernorm_epsilon, pre_norm=True, final_norm=True
    )
    extra = {"norm_pre.weight": sd["ln_pre.weight"], "norm_pre.bias": sd["ln_pre.bias"], "norm.weight": sd["ln_post.weight"], "norm.bias": sd["ln_post.bias"]}
    backbone = _build(config, layers, extra, fused, "OpenCLIP visual transformer")
    pos = sd["positional_embedding"]
    grid = round((pos.shape[0] - 1) ** 0.5)
    tok = ImageTokenizer(d, grid * patch, patch, in_chans, patch_bias=False)
    load_strict(tok, {"proj.weight": conv, "cls_token": sd["class_embedding"].reshape(1, 1, d), "pos_embed": pos[None]}, "OpenCLIP patch embedding")
    return Encoder(tok, backbone)


# ---------------------------------------------------------------------------------- Meta-Transformer
_MT_BLOCK_KEYS = (
    "norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
    "norm2.weight", "norm2.bias", "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias",
)


def meta_transformer_to_mmte(state_dict: dict[str, Tensor], num_heads: int) -> dict[str, Tensor]:
    """Map the Meta-Transformer encoder release (``nn.Sequential`` of timm Blocks: keys
    ``{i}.norm1.weight`` ... ``{i}.mlp.fc2.bias``, 12 per block) to mmte backbone keys."""
    sd = {k: v for k, v in state_dict.items()}
    n = _num_layers(sd, r"(\d+)\.")
    out: dict[str, Tensor] = {}
    for i in range(n):
        blk = {k: sd[f"{i}.{k}"] for k in _MT_BLOCK_KEYS if f"{i}.{k}" in sd}
        blk = {("blocks.0." + k): v for k, v in blk.items()}
        try:
            layer = _timm_layers(blk, 1)[0]
        except KeyError as e:
            raise ValueError(f"Meta-Transformer block {i} lacks key {i}.{str(e.args[0])[len('blocks.0.'):]}") from None
        out.update(layer.to_mmte(i, num_heads, post_norm=False))
    return out


def load_meta_transformer(
    path_or_state_dict: str | os.PathLike | dict[str, Tensor],
    preset: str | BackboneConfig = "meta-transformer-b16",
    *,
    fused: bool = False,
) -> Backbone:
    """Load the Meta-Transformer encoder release into a :class:`Backbone` (strict).

    Args:
        path_or_state_dict: a ``.pth`` (read with ``weights_only=True``) / ``.safetensors`` file, or a
            state dict, in the release's layout (``0.attn.qkv.weight``, ...; an ``encoder.`` or
            ``blocks.`` prefix is accepted).
        preset: the backbone shape the weights must fit.

    Raises:
        ValueError: listing missing / unexpected keys, or tensors whose shapes do not fit ``preset``.
    """
    sd = load_state_dict_file(path_or_state_dict) if isinstance(path_or_state_dict, (str, os.PathLike)) else dict(path_or_state_dict)
    for prefix in ("encoder.", "blocks.", "module."):
        if sd and all(k.startswith(prefix) for k in sd):
            sd = _pop_prefix(sd, prefix)
    config = get_preset(preset) if isinstance(preset, str) else preset
    expected = {f"{i}.{k}" for i in range(config.num_layers) for k in _MT_BLOCK_KEYS}
    missing, unexpected = sorted(expected - set(sd)), sorted(set(sd) - expected)
    if missing or unexpected:
        raise ValueError(
            f"Meta-Transformer state dict does not fit {config.num_layers} blocks: missing keys {missing[:24]}"
            f"{' ...' if len(missing) > 24 else ''}, unexpected keys {unexpected[:24]}{' ...' if len(unexpected) > 24 else ''}"
        )
    backbone = Backbone(config)
    load_strict(backbone, meta_transformer_to_mmte(sd, config.num_attention_heads), "Meta-Transformer encoder")
    if fused:
        backbone.fuse()
    return backbone
