"""mmte: Meta-Transformer-style multimodal models on one shared, fused transformer backbone.

The public API is re-exported here and every name loads lazily on first use, so importing one
sub-package (``import mmte.te``) loads that sub-package and what it imports, nothing else.
"""

from __future__ import annotations

import importlib
import importlib.util

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
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")  # a sub-module: mmte.heads, mmte.device, ...
    raise AttributeError(f"module 'mmte' has no attribute {name!r}")
