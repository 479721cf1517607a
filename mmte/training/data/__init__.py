"""LightningDataModules over :mod:`mmte.data` (Hugging Face ``datasets``), one file per kind of source.

* :mod:`.base` -- :class:`MMTEDataModule`: sources, splits, loaders, fitted state, ``model_info``;
* :mod:`.samplers` -- the training / evaluation samplers and the streams' resumable loader;
* :mod:`.state` -- the data state saved in checkpoints, read back for ``state_from``;
* :mod:`.array`, :mod:`.folder`, :mod:`.table`, :mod:`.forecast`, :mod:`.paired`, :mod:`.hf` -- the sources
  (:mod:`.hf_stream`: the streamed training split of :mod:`.hf`).

Recipes name them as ``mmte.training.data.<Class>``.
"""

from __future__ import annotations

from .array import ArrayDataModule
from .base import MMTEDataModule
from .folder import FolderDataModule, group_folds
from .forecast import ForecastDataModule
from .hf import HFDataModule
from .paired import PairedDataModule
from .samplers import ResumableLoader, eval_sampler, train_sampler
from .state import checkpoint_for_state, read_data_state
from .table import TableDataModule

__all__ = [
    "ArrayDataModule",
    "FolderDataModule",
    "ForecastDataModule",
    "HFDataModule",
    "MMTEDataModule",
    "PairedDataModule",
    "ResumableLoader",
    "TableDataModule",
    "checkpoint_for_state",
    "eval_sampler",
    "group_folds",
    "read_data_state",
    "train_sampler",
]
