"""The model a recipe describes, completed from the data and from the backbone's weight source.

A recipe may leave out what the data determines (classes, output width, forecast horizon,
tokenizer options) and the backbone's shape when its weights name it; :func:`apply_data_info` and
:func:`backbone_from_source` fill those in and refuse explicit values that disagree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from ..config import check_head_entry, check_tokenizer_entry
from ..encoders import BackboneConfig, get_preset
from ..encoders.sources import source_config, source_name
from ..registry import entry_from_class_path

__all__ = ["apply_data_info", "backbone_config", "backbone_from_source", "check_entries"]


def backbone_from_source(backbone: Any, weights: str | os.PathLike | None) -> Any:
    """``model.backbone`` given ``backbone_weights``: the source's own shape when ``backbone`` is None
    (named and hub sources, mmte ``.safetensors`` files carrying their config); an explicit one must
    agree with it.

    Raises:
        ValueError: no shape from either, or the two disagree (naming both).
    """
    cfg = source_config(weights) if weights is not None else None
    if backbone is None:
        named = source_name(weights) if weights is not None else None
        if named is not None:
            return named  # a named source's preset has its name
        if cfg is None:
            raise ValueError(
                "model.backbone is required (a preset name such as 'minilm-l6' or 'tiny') unless backbone_weights names a "
                f"source or an mmte .safetensors file that carries its config; got backbone_weights={weights!r}"
            )
        return cfg
    want = backbone_config(backbone)
    if cfg is not None and want is not None and want != cfg:
        raise ValueError(
            f"model.backbone {backbone!r} is {want} but backbone_weights {os.fspath(weights)!r} is {cfg}; "
            "leave model.backbone out to take the weights' own shape, or make them agree"
        )
    return backbone


def backbone_config(backbone: Any) -> BackboneConfig | None:
    """The :class:`BackboneConfig` of a preset name, a ``{preset: name, field: value}`` dict or a config; None otherwise."""
    if isinstance(backbone, str):
        return get_preset(backbone)
    if isinstance(backbone, Mapping):
        cfg = dict(backbone)
        preset = cfg.pop("preset", None)
        return get_preset(preset, **cfg) if preset else BackboneConfig(**cfg)
    if isinstance(backbone, BackboneConfig):
        return backbone
    return None


def check_entries(tokenizers: Mapping[str, Any], heads: Mapping[str, Any]) -> None:
    """Check every tokenizer and head entry against its typed config (:mod:`mmte.config`): a misspelt option
    or a value of the wrong type is refused in one line naming the entry, before the model is built.
    Ready modules (Python callers) are skipped."""
    for key, entry in tokenizers.items():
        if isinstance(entry, (str, Mapping)):
            check_tokenizer_entry(key, entry)
    for key, entry in heads.items():
        if isinstance(entry, Mapping):
            check_head_entry(key, entry)


def head_task(cfg: Mapping[str, Any]) -> str | None:
    """The built-in task (``classification``, ``regression``...) of a head config's class: a registered
    subclass of a built-in head (``examples/ecg.py``'s ``attention_pool``) gets its parent's metrics and
    data-filled options. None without a ``name`` (a modality's default head)."""
    from ..heads import get_head

    name = cfg.get("name")
    return None if not isinstance(name, str) else getattr(get_head(name), "task", None)


def apply_data_info(tokenizers: Mapping[str, Any], heads: Mapping[str, Any], info: Mapping[str, Any] | None, dim: int | None = None):
    """Fill what the data knows into the model config; explicit values must agree.

    ``info`` (a DataModule's ``model_info``) may hold ``num_classes`` (classification heads),
    ``out_dim`` (regression heads), ``horizon`` and ``input_len`` (forecasting heads; ``num_patches``
    is computed from the time-series tokenizer) and ``tokenizers: {key: {option: value}}``.

    Returns:
        ``(tokenizers, heads)`` as new dicts.

    Raises:
        ValueError: an explicit value differs from the data's.
    """
    info = dict(info or {})
    toks = {k: (dict(entry_from_class_path(v)) if isinstance(v, Mapping) else v) for k, v in tokenizers.items()}
    hds = {k: (dict(entry_from_class_path(v)) if isinstance(v, Mapping) else v) for k, v in (heads or {}).items()}

    def fill(d: dict, key: str, value: Any, where: str) -> None:
        if value is None:
            return
        if d.get(key) is None:
            d[key] = value
        elif d[key] != value and not (isinstance(value, (list, tuple)) and list(d[key]) == list(value)):
            raise ValueError(f"{where}.{key} is {d[key]!r} but the data gives {value!r}; remove it from the recipe or make them agree")

    for key, opts in (info.get("tokenizers") or {}).items():
        if key not in toks:
            raise ValueError(f"the data provides modality {key!r} but the model has tokenizers {list(toks)}")
        if isinstance(toks[key], str):
            toks[key] = {"name": toks[key]}
        if isinstance(toks[key], dict):
            for o, v in opts.items():
                fill(toks[key], o, v, f"model.tokenizers.{key}")
    _check_audio_frontend(toks, info.get("audio_frontend"))
    for name, h in hds.items():
        if not isinstance(h, dict):
            continue
        kind = head_task(h)
        if kind == "classification":
            fill(h, "num_classes", info.get("num_classes"), f"model.heads.{name}")
        elif kind == "regression":
            fill(h, "out_dim", info.get("out_dim"), f"model.heads.{name}")
        elif kind == "forecasting":
            fill(h, "horizon", info.get("horizon"), f"model.heads.{name}")
            # num_patches: "auto" / absent -> computed from the input length; "mean": the mean-pool head (a recipe's
            # null reads as "not set" in the typed entry, so the mean-pool head has its own word)
            if h.get("num_patches") == "mean":
                h.pop("num_patches")
            elif h.get("num_patches", "auto") == "auto":
                if info.get("input_len"):
                    h["num_patches"] = _num_patches(toks, h, int(info["input_len"]))
                else:
                    h.pop("num_patches", None)
    return toks, hds


def _check_audio_frontend(toks: Mapping[str, Any], frontend: str | None) -> None:
    """The audio tokenizer's stem reads the spectrogram the data computes: the speech-embedding stem its own
    log-mel (``preprocess: {frontend: speech_embedding}``), the others Kaldi's fbank."""
    cfg = toks.get("audio")
    if frontend is None or cfg is None:
        return
    cfg = {"name": cfg} if isinstance(cfg, str) else cfg
    if not isinstance(cfg, Mapping) or cfg.get("name", "audio") != "audio":
        return
    want = "speech_embedding" if cfg.get("stem") == "speech_embedding" else "kaldi"
    if frontend != want:
        raise ValueError(f"model.tokenizers.audio has stem {cfg.get('stem', 'patch')!r}, which reads the {want!r} spectrogram, but the "
                         f"data's preprocess frontend is {frontend!r}; set data preprocess frontend: {want} (or change the stem)")


def _num_patches(toks: Mapping[str, Any], head: Mapping[str, Any], length: int) -> int:
    from ..tokenizers.registry import get_modality

    inputs = head.get("inputs") or list(toks)
    key = inputs if isinstance(inputs, str) else inputs[0]
    spec = toks[key]
    cfg = {"name": spec} if isinstance(spec, str) else dict(spec)
    name = cfg.pop("name", key)
    with torch.device("meta"):
        tok = get_modality(name).create(8, **cfg)
    if not hasattr(tok, "num_patches"):
        raise ValueError(f"forecasting head reads {key!r} whose tokenizer has no num_patches(length); set num_patches explicitly")
    return int(tok.num_patches(length))
