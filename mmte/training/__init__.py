"""mmte.training: the Lightning side of mmte (the only sub-package that imports lightning).

Names are imported lazily, so ``import mmte.training.module`` does not pull in the parallel
strategy or the FP8 plugin.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "MMTEModule": ".module",
    "resolve_backbone_source": ".module",
    "BACKBONE_SOURCES": ".module",
    "MMTEDataModule": ".data",
    "ArrayDataModule": ".data",
    "FolderDataModule": ".data",
    "TableDataModule": ".data",
    "ForecastDataModule": ".data",
    "PairedDataModule": ".data",
    "HFDataModule": ".data",
    "MMTECheckpoint": ".callbacks",
    "PredictionWriter": ".callbacks",
    "MMTEStrategy": ".strategy",
    "MUSAAccelerator": ".accelerator",
    "FP8Precision": ".precision",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
