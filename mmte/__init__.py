"""mmte: Meta-Transformer-style multimodal models on one shared, fused transformer backbone.

The public API is re-exported here and every name loads lazily on first use, so importing one
sub-package (``import mmte.te``) loads that sub-package and what it imports, nothing else.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# name -> module that defines it (imported on first access)
_LAZY = {
    "Backbone": "mmte.encoders",
    "BackboneConfig": "mmte.encoders",
    "from_hf": "mmte.encoders",
    "from_timm": "mmte.encoders",
    "load_meta_transformer": "mmte.encoders",
    "TokenSeq": "mmte.seq",
    "MetaTransformer": "mmte.model",
    "create_model": "mmte.model",
    "list_modalities": "mmte.tokenizers.registry",
    "register_modality": "mmte.tokenizers.registry",
    "get_modality": "mmte.tokenizers.registry",
    "MMTEModule": "mmte.training.module",
}

__all__ = [
    "Backbone",
    "BackboneConfig",
    "MMTEModule",
    "MetaTransformer",
    "TokenSeq",
    "__version__",
    "create_model",
    "device",
    "from_hf",
    "from_timm",
    "get_modality",
    "list_modalities",
    "load_meta_transformer",
    "register_modality",
]


def __getattr__(name: str):
    if name == "device":  # the submodule (``mmte.device``)
        return importlib.import_module("mmte.device")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mmte' has no attribute {name!r}")
