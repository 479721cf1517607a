"""Hugging Face converters: BERT, ViT and CLIP vision models from ``transformers`` -> an mmte :class:`Encoder`.

Each model's layers are described as :class:`~mmte.encoders.convert._Layer` records, so the QKV layout and the
pre/post-norm placement go through the same code as the timm and Meta-Transformer converters.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from ..tokenizers.image import ImageTokenizer
from ..tokenizers.text import TextTokenizer
from .backbone import Backbone
from .convert import _build, _cat_qkv, _hf_act, _Layer, _norm, _pop_prefix, load_strict
from .encoder import Encoder
from .presets import BackboneConfig

logger = logging.getLogger(__name__)

__all__ = ["bert_backbone", "from_hf"]

Tensor = torch.Tensor


def _hf_layers(sd: dict[str, Tensor], n: int, names: dict[str, str]) -> list[_Layer]:
    out = []
    for i in range(n):
        p = names["layer"].format(i=i)
        q, k, v = (p + names[x] for x in ("q", "k", "v"))
        out.append(
            _Layer(
                _cat_qkv(sd, q, k, v, ".weight"),
                _cat_qkv(sd, q, k, v, ".bias"),
                sd[p + names["o"] + ".weight"],
                sd.get(p + names["o"] + ".bias"),
                _norm(sd, p + names["n1"]),
                _norm(sd, p + names["n2"]),
                sd[p + names["fc1"] + ".weight"],
                sd.get(p + names["fc1"] + ".bias"),
                sd[p + names["fc2"] + ".weight"],
                sd.get(p + names["fc2"] + ".bias"),
            )
        )
    return out


def _pick_names(sd: dict[str, Tensor], options: list[dict[str, str]]) -> dict[str, str]:
    for names in options:
        if names["layer"].format(i=0) + names["q"] + ".weight" in sd:
            return names
    raise ValueError("unrecognised Hugging Face layer layout; first keys: " + str(sorted(sd)[:8]))


def _strip_base(sd: dict[str, Tensor], bases: tuple[str, ...]) -> dict[str, Tensor]:
    for b in bases:
        if any(k.startswith(b) for k in sd):
            return _pop_prefix(sd, b)
    return sd


def bert_backbone(sd: dict[str, Tensor], cfg: Any, fused: bool = False) -> Backbone:
    """The transformer trunk of a BERT checkpoint as a :class:`Backbone`, from its state dict (keys as
    ``BertModel.state_dict()``, with or without the ``bert.`` prefix; embeddings are not needed) and its
    config (a ``BertConfig`` or anything with the same attributes, e.g. the parsed ``config.json``).

    Raises:
        ValueError: relative position embeddings, an unknown activation, or keys of another layout.
    """
    if getattr(cfg, "position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"only absolute position embeddings are supported; got {cfg.position_embedding_type!r}")
    sd = _strip_base(dict(sd), ("bert.",))
    names = _pick_names(
        sd,
        [
            {"layer": "encoder.layer.{i}.", "q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
                 "o": "attention.output.dense", "n1": "attention.output.LayerNorm", "n2": "output.LayerNorm",
                 "fc1": "intermediate.dense", "fc2": "output.dense"},
        ],
    )
    n = cfg.num_hidden_layers
    config = BackboneConfig(
        n, cfg.hidden_size, cfg.num_attention_heads, cfg.intermediate_size, activation=_hf_act(cfg.hidden_act),
        layernorm_epsilon=cfg.layer_norm_eps, layer_norm_position="post", final_norm=False,
    )
    return _build(config, _hf_layers(sd, n, names), {}, fused, "BERT encoder")


def _from_hf_bert(model: nn.Module, fused: bool) -> Encoder:
    cfg = model.config
    sd = _strip_base(model.state_dict(), ("bert.",))
    backbone = bert_backbone(sd, cfg, fused)
    tok = TextTokenizer(
        cfg.hidden_size, cfg.vocab_size, cfg.max_position_embeddings, cfg.type_vocab_size,
        cfg.pad_token_id if cfg.pad_token_id is not None else 0, cfg.layer_norm_eps,
    )
    e = "embeddings."
    load_strict(
        tok,
        {
            "word_embeddings.weight": sd[e + "word_embeddings.weight"],
            "position_embeddings.weight": sd[e + "position_embeddings.weight"],
            "token_type_embeddings.weight": sd[e + "token_type_embeddings.weight"],
            "norm.weight": sd[e + "LayerNorm.weight"],
            "norm.bias": sd[e + "LayerNorm.bias"],
        },
        "BERT embeddings",
    )
    return Encoder(tok, backbone)


def _from_hf_vit(model: nn.Module, fused: bool) -> Encoder:
    cfg = model.config
    sd = _strip_base(model.state_dict(), ("vit.",))
    names = _pick_names(
        sd,
        [
            {"layer": "layers.{i}.", "q": "attention.q_proj", "k": "attention.k_proj", "v": "attention.v_proj", "o": "attention.o_proj",
                 "n1": "layernorm_before", "n2": "layernorm_after", "fc1": "mlp.fc1", "fc2": "mlp.fc2"},
            {"layer": "encoder.layer.{i}.", "q": "attention.attention.query", "k": "attention.attention.key",
                 "v": "attention.attention.value", "o": "attention.output.dense", "n1": "layernorm_before", "n2": "layernorm_after",
                 "fc1": "intermediate.dense", "fc2": "output.dense"},
        ],
    )
    n = cfg.num_hidden_layers
    final = "layernorm.weight" in sd
    config = BackboneConfig(
        n, cfg.hidden_size, cfg.num_attention_heads, cfg.intermediate_size, activation=_hf_act(cfg.hidden_act),
        layernorm_epsilon=cfg.layer_norm_eps, qkv_bias=cfg.qkv_bias, final_norm=final,
    )
    extra = {"norm.weight": sd["layernorm.weight"], "norm.bias": sd["layernorm.bias"]} if final else {}
    backbone = _build(config, _hf_layers(sd, n, names), extra, fused, "ViT encoder")
    e = "embeddings."
    tok = ImageTokenizer(cfg.hidden_size, cfg.image_size, cfg.patch_size, cfg.num_channels, dynamic_img_size=False)
    load_strict(
        tok,
        {
            "proj.weight": sd[e + "patch_embeddings.projection.weight"],
            "proj.bias": sd[e + "patch_embeddings.projection.bias"],
            "cls_token": sd[e + "cls_token"],
            "pos_embed": sd[e + "position_embeddings"],
        },
        "ViT embeddings",
    )
    return Encoder(tok, backbone)


def _from_hf_clip_vision(model: nn.Module, fused: bool) -> Encoder:
    cfg = model.config
    sd = _strip_base(model.state_dict(), ("vision_model.",))
    names = _pick_names(
        sd,
        [
            {"layer": "encoder.layers.{i}.", "q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
                 "o": "self_attn.out_proj", "n1": "layer_norm1", "n2": "layer_norm2", "fc1": "mlp.fc1", "fc2": "mlp.fc2"},
        ],
    )
    n = cfg.num_hidden_layers
    config = BackboneConfig(
        n, cfg.hidden_size, cfg.num_attention_heads, cfg.intermediate_size, activation=_hf_act(cfg.hidden_act),
        layernorm_epsilon=cfg.layer_norm_eps, pre_norm=True, final_norm=False,
    )
    extra = {"norm_pre.weight": sd["pre_layrnorm.weight"], "norm_pre.bias": sd["pre_layrnorm.bias"]}
    backbone = _build(config, _hf_layers(sd, n, names), extra, fused, "CLIP vision encoder")
    e = "embeddings."
    d = cfg.hidden_size
    tok = ImageTokenizer(d, cfg.image_size, cfg.patch_size, cfg.num_channels, patch_bias=False, dynamic_img_size=False)
    load_strict(
        tok,
        {
            "proj.weight": sd[e + "patch_embedding.weight"],
            "cls_token": sd[e + "class_embedding"].reshape(1, 1, d),
            "pos_embed": sd[e + "position_embedding.weight"][None],
        },
        "CLIP vision embeddings",
    )
    return Encoder(tok, backbone)


_HF_CONVERTERS = {
    "BertModel": _from_hf_bert,
    "ViTModel": _from_hf_vit,
    "CLIPVisionModel": _from_hf_clip_vision,
    "CLIPVisionTransformer": _from_hf_clip_vision,
}


def from_hf(model: nn.Module, *, fused: bool = False) -> Encoder:
    """Convert a Hugging Face ``BertModel``, ``ViTModel`` or ``CLIPVisionModel`` into an :class:`Encoder`.

    ``forward_features`` equals the model's ``last_hidden_state``: BERT takes
    ``(input_ids, attention_mask=None, token_type_ids=None)``, the vision models ``(pixel_values)``.
    """
    name = type(model).__name__
    if name not in _HF_CONVERTERS:
        raise ValueError(f"from_hf supports {sorted(_HF_CONVERTERS)}; got {name}")
    enc = _HF_CONVERTERS[name](model, fused)
    logger.info("converted Hugging Face %s: %d layers, width %d", name, enc.backbone.config.num_layers, enc.backbone.hidden_size)
    return enc
