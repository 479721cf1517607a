"""Two single-modality DataModules paired by label, split by split (e.g. spoken digits with digit images)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ...data import datasets as mds
from .base import SPLITS, MMTEDataModule

__all__ = ["PairedDataModule"]


class PairedDataModule(MMTEDataModule):
    """Two single-modality DataModules paired by label, split by split: every item of ``first`` is
    matched with an item of ``second`` that has the same label (a seeded cycle through them).

    E.g. each spoken digit (FSDD, a :class:`FolderDataModule`) with a handwritten digit image of the
    same digit (scikit-learn digits, an :class:`ArrayDataModule`). Batches hold both modalities and
    ``label``.

    Args:
        first: the DataModule whose items are enumerated.
        second: the DataModule items are drawn from; its class names must equal first's.
        **kwargs: :class:`MMTEDataModule` options (batching, seed).
    """

    def __init__(self, first: MMTEDataModule, second: MMTEDataModule, **kwargs: Any):
        super().__init__(**kwargs)
        for name, dm in (("first", first), ("second", second)):
            if not isinstance(dm, MMTEDataModule) or not hasattr(dm, "modality"):
                raise TypeError(f"{name} must be a single-modality MMTEDataModule (Folder/Array); got {type(dm).__name__}")
        if first.modality == second.modality:
            raise ValueError(f"paired modalities must differ; both are {first.modality!r}")
        self.first, self.second = first, second
        self._init_state()

    def fit_state(self) -> dict[str, Any]:
        return {"first": self.first.state_dict(), "second": self.second.state_dict()}

    def apply_state(self, state: Mapping[str, Any]) -> None:
        self.first.load_state_dict(state["first"])
        self.second.load_state_dict(state["second"])
        if self.first.class_names != self.second.class_names:
            raise ValueError(f"cannot pair by label: class names differ ({self.first.class_names} vs {self.second.class_names})")
        self.class_names = self.first.class_names
        self.datasets.clear()

    def collates_for(self, split: str) -> dict[str, Callable]:
        return {**self.first.collates_for(split), **self.second.collates_for(split)}

    def build_split(self, split: str) -> None:
        if split not in SPLITS:
            raise ValueError(f"PairedDataModule has no {split!r} split; it has {SPLITS}")
        a_mod, b_mod = self.first.modality, self.second.modality
        da, db = self.first._ensure(split), self.second._ensure(split)
        self.collates = {**self.first.collates, **self.second.collates}
        if da is None or db is None or len(da) == 0 or len(db) == 0:
            self.datasets[split] = []
            self._why_empty[split] = (f"first: {self.first._why_empty.get(split, 'empty')}" if da is None or len(da) == 0
                                      else f"second: {self.second._why_empty.get(split, 'empty')}")
            return
        la, lb = _labels(da), _labels(db)
        pairs = mds.pair_by_label(la, lb, self.seed + SPLITS.index(split))
        ds = mds.arrays_dataset(np.asarray([p[0] for p in pairs]), None, "a").add_column("b", [p[1] for p in pairs])
        ds = ds.add_column("label", [la[i] for i, _ in pairs]).add_column("index", list(range(len(pairs))))

        def get_a(i, da=da):
            return da[int(i)][a_mod]

        def get_b(i, db=db):
            return db[int(i)][b_mod]

        self.datasets[split] = mds.lazy_preprocess(ds, {a_mod: ("a", get_a), b_mod: ("b", get_b)}, ("label", "index"))
        na, nb = self.first.names.get(split, []), self.second.names.get(split, [])
        self.names[split] = [f"{na[i] if na else i}|{nb[j] if nb else j}" for i, j in pairs]

    def empty_message(self, split: str) -> str:
        name = self.predict_split if split == "predict" else split
        why = self._why_empty.get(name, "it has no items")
        return (f"the {name!r} split is empty ({why}); set it on the paired DataModules, e.g. "
                f"--data.init_args.first.init_args.{name}_regex or their {name}_fraction")


def _labels(ds) -> list[int]:
    """A preprocessed dataset's labels without running its transform."""
    raw = ds.with_format(None)
    col = raw["label"]
    return [int(v) for v in (col.tolist() if hasattr(col, "tolist") else col)]
