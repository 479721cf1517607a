"""mmte.data.splits.carve_splits, the split carving the folder and Hugging Face data modules share, against
a naive reference written here: selections first (test, then val, from what is left), then fractions drawn
from the rest, train keeps what remains; each split's rows in row order, every row in exactly one split."""

from __future__ import annotations

import pytest

from mmte.data.splits import carve_splits, group_split, split_indices

GROUPS = ["a", "b", "c", "d", "e"] * 8  # 40 rows, 5 groups
LABELS = [str(i % 3) for i in range(40)]


def _naive(n, selected, fractions, seed, groups=None, labels=None):
    out = {"train": [], "val": [], "test": []}
    taken: set[int] = set()
    for s in ("test", "val"):
        if s in selected:
            out[s] = sorted(set(selected[s]) - taken)
            taken |= set(out[s])
    rest = [i for i in range(n) if i not in taken]
    if any(fractions.values()):
        vf, tf = fractions.get("val", 0.0), fractions.get("test", 0.0)
        if groups is not None:
            parts = group_split([groups[i] for i in rest], vf, tf, seed)
            for s in fractions:
                out[s] = [i for i in rest if groups[i] in parts[s]]
        else:
            drawn = split_indices([(labels or ["0"] * n)[i] for i in rest], vf, tf, seed)
            for s in fractions:
                out[s] = [rest[j] for j in drawn[s]]
        taken |= {i for s in fractions for i in out[s]}
    out["train"] = [i for i in range(n) if i not in taken]
    return out


@pytest.mark.parametrize("selected, fractions, by_group", [
    ({"test": [0, 5, 10], "val": [5, 6, 7]}, {}, False),              # val overlaps test: test keeps the shared row
    ({"test": [i for i, g in enumerate(GROUPS) if g == "a"]}, {"val": 0.25}, True),
    ({}, {"val": 0.2, "test": 0.2}, False),                             # stratified fractions only
    ({"val": [1, 2, 3]}, {"test": 0.25}, False),
    ({}, {"val": 0.0, "test": 0.0}, True),                              # nothing held out
])
def test_carve_splits_equals_the_naive_reference(selected, fractions, by_group):
    kw = {"groups": GROUPS} if by_group else {"labels": LABELS}
    got = carve_splits(40, selected, fractions, seed=3, **kw)
    assert got == _naive(40, selected, fractions, 3, **kw)
    assert sorted(i for part in got.values() for i in part) == list(range(40))  # each row once
    for part in got.values():
        assert part == sorted(part)
    if by_group and fractions.get("val"):
        held = {GROUPS[i] for i in got["val"]}
        assert held and not held & {GROUPS[i] for i in got["train"]}  # whole groups


def test_an_overlapping_selection_goes_to_test_first():
    got = carve_splits(6, {"test": [1, 2], "val": [2, 3]}, {}, seed=0)
    assert got == {"train": [0, 4, 5], "val": [3], "test": [1, 2]}
