"""In-memory arrays (scikit-learn's bundled datasets) as a DataModule: what the quickstart trains on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...data import datasets as mds
from ...tokenizers.registry import get_modality
from .base import SPLITS, MMTEDataModule, preprocess_fn

__all__ = ["ArrayDataModule"]


class ArrayDataModule(MMTEDataModule):
    """In-memory arrays: one of scikit-learn's bundled datasets (``"digits"``: 1,797 8x8 images).

    Args:
        dataset: ``digits`` (images [8, 8] in [0, 1]), or ``iris``/``wine``/``breast_cancer`` (feature vectors; use those with TableDataModule and sklearn://).
        modality: the batch key and the registry modality whose preprocessing is applied.
        preprocess: keyword arguments of that preprocessing (e.g. image ``size``, ``mean``, ``std``, ``channels``).
        **kwargs: :class:`MMTEDataModule` options.
    """

    def __init__(self, dataset: str = "digits", modality: str = "image", preprocess: dict[str, Any] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        if dataset not in mds.SKLEARN_DATASETS:
            raise ValueError(f"unknown dataset {dataset!r}; expected one of {mds.SKLEARN_DATASETS}")
        self.dataset, self.modality, self.preprocess = dataset, modality, dict(preprocess or {})
        self.preprocess_item = preprocess_fn(modality, self.preprocess)  # one item -> one sample; validates the modality name now
        self._x, self._y, names = mds.sklearn_arrays(dataset)
        self._dataset_classes = names
        self.class_names = names
        self._split: dict[str, list[int]] | None = None
        self.indices: dict[str, list[int]] = {}  # split -> rows of the scikit-learn dataset
        self._init_state()

    @property
    def item_shape(self) -> tuple[int, ...]:
        """The shape of one item of the dataset (digits: ``(8, 8)``)."""
        return tuple(int(s) for s in self._x.shape[1:])

    def apply_state(self, state: Mapping[str, Any]) -> None:
        if list(state["class_names"]) != self._dataset_classes:
            raise ValueError(f"the checkpoint's classes {state['class_names']} are not those of {self.dataset!r} ({self._dataset_classes})")
        super().apply_state(state)

    def build_split(self, split: str) -> None:
        if split not in SPLITS:
            raise ValueError(f"ArrayDataModule has no {split!r} split; it has {SPLITS}")
        if self._split is None:
            self._split = self._split_by_fraction(self._y)
        idx = self._split[split]
        fns = {self.modality: ("x", self.preprocess_item)}
        self.collates = {self.modality: get_modality(self.modality).collate_fn}
        ds = mds.arrays_dataset(self._x[idx], self._y[idx]).add_column("index", list(range(len(idx))))
        self.datasets[split] = self._prepare(ds, fns, (self.dataset, self.modality, self.preprocess, split, self.seed, "pos"))
        self.names[split] = [f"{self.dataset}[{i}]" for i in idx]
        self.indices[split] = [int(i) for i in idx]
        if split != "train":
            self._why_empty[split] = f"{split}_fraction is {getattr(self, f'{split}_fraction', 0.0)}"
