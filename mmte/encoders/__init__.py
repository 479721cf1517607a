"""mmte.encoders: the shared backbone, its presets and pretrained-weight import."""

from .backbone import Backbone
from .convert import (
    from_timm,
    load_meta_transformer,
    load_state_dict_file,
    meta_transformer_to_mmte,
    open_clip_to_mmte,
)
from .convert_hf import from_hf
from .encoder import Encoder
from .presets import PRESETS, BackboneConfig, get_preset, list_presets
from .sources import BACKBONE_SOURCES, resolve_backbone_source, source_config
from .weights import load_backbone_state, normalize_backbone_keys

__all__ = [
    "BACKBONE_SOURCES",
    "PRESETS",
    "Backbone",
    "BackboneConfig",
    "Encoder",
    "from_hf",
    "from_timm",
    "get_preset",
    "list_presets",
    "load_backbone_state",
    "load_meta_transformer",
    "load_state_dict_file",
    "meta_transformer_to_mmte",
    "normalize_backbone_keys",
    "open_clip_to_mmte",
    "resolve_backbone_source",
    "source_config",
]
