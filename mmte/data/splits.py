"""Train / validation / test splits of a dataset's items: stratified fractions, whole groups, folds.

Splits are deterministic for a seed and depend only on the labels or group names, so a DataModule
rebuilt from the same data and options carves the same items out again. Held-out *groups* (a speaker,
a site) keep every item of a group in one split, so a model is evaluated on groups it never saw.

scikit-learn supplies the leave-one-group-out folds (``LeaveOneGroupOut``). The fraction splits stay
here: scikit-learn's ``StratifiedShuffleSplit`` / ``GroupShuffleSplit`` allot the held-out counts
differently (class counts by a hypergeometric mode, ``ceil`` of the group fraction; neither gives
val and test in one call, and the stratified one refuses a class with one item), which would move
items between splits that the recipes' saved results and the tests rely on.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["carve_splits", "group_split", "leave_one_group_out", "split_indices"]


def _check_fractions(val_fraction: float, test_fraction: float) -> None:
    for name, f in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0.0 <= f < 1.0:
            raise ValueError(f"{name} must be in [0, 1); got {f}")


def split_indices(
    labels: Sequence[int],
    val_fraction: float = 0.2,
    test_fraction: float = 0.0,
    seed: int = 0,
    stratify: bool = True,
) -> dict[str, list[int]]:
    """Deterministic train/val/test index lists; stratified by label (each class split in proportion,
    ``round(fraction * class size)`` items of it held out).

    Returns:
        ``{"train": [...], "val": [...], "test": [...]}`` sorted item indices.

    Raises:
        ValueError: fractions outside [0, 1) or summing to >= 1.
    """
    _check_fractions(val_fraction, test_fraction)
    if val_fraction + test_fraction >= 1.0:
        raise ValueError(f"val_fraction + test_fraction must be < 1; got {val_fraction} + {test_fraction}")
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    groups = [np.flatnonzero(labels == c) for c in np.unique(labels)] if stratify else [np.arange(len(labels))]
    out: dict[str, list[int]] = {"train": [], "val": [], "test": []}
    for g in groups:
        g = rng.permutation(g)
        n_val, n_test = round(len(g) * val_fraction), round(len(g) * test_fraction)
        out["val"] += g[:n_val].tolist()
        out["test"] += g[n_val : n_val + n_test].tolist()
        out["train"] += g[n_val + n_test :].tolist()
    return {k: sorted(v) for k, v in out.items()}


def group_split(groups: Sequence[str], val_fraction: float = 0.0, test_fraction: float = 0.0, seed: int = 0) -> dict[str, list[str]]:
    """Whole groups (speakers, sites...) for validation and test: a seeded permutation of the sorted
    group names; ``round(fraction * n_groups)`` groups each, at least one when the fraction is > 0.

    Returns:
        ``{"train": [...], "val": [...], "test": [...]}`` group names.

    Raises:
        ValueError: fractions outside [0, 1), or too few groups to give every split one.
    """
    _check_fractions(val_fraction, test_fraction)
    names = sorted(set(groups))
    order = [names[i] for i in np.random.default_rng(seed).permutation(len(names))]
    n_val = max(1, round(len(names) * val_fraction)) if val_fraction > 0 else 0
    n_test = max(1, round(len(names) * test_fraction)) if test_fraction > 0 else 0
    if n_val + n_test >= len(names):
        raise ValueError(
            f"cannot hold out {n_val} validation and {n_test} test group(s) of {len(names)} ({names}) and keep one for training; "
            f"lower val_fraction/test_fraction or name the groups (val_groups/test_groups)"
        )
    return {"val": sorted(order[:n_val]), "test": sorted(order[n_val : n_val + n_test]), "train": sorted(order[n_val + n_test :])}


def leave_one_group_out(groups: Sequence[str]) -> list[tuple[str, list[int], list[int]]]:
    """Leave-one-group-out folds (scikit-learn's ``LeaveOneGroupOut``), one per group in sorted order.

    Returns:
        ``[(held-out group, train indices, test indices), ...]``.
    """
    from sklearn.model_selection import LeaveOneGroupOut

    g = np.asarray(list(groups))
    folds = []
    for tr, te in LeaveOneGroupOut().split(np.zeros(len(g)), groups=g):
        folds.append((str(g[te[0]]), tr.tolist(), te.tolist()))
    return sorted(folds)


def carve_splits(n: int, selected: dict[str, Sequence[int]], fractions: dict[str, float], seed: int = 0,
                 groups: Sequence[str] | None = None, labels: Sequence[str] | None = None) -> dict[str, list[int]]:
    """Row indices ``{"train", "val", "test"}`` of ``n`` rows of one training source.

    A split named in ``selected`` takes the rows it selects (by file pattern, group list or split column;
    test first, then val, each from the rows still left); the splits named in ``fractions`` are then drawn
    from what is left: whole groups when ``groups`` (one per row) is given (:func:`group_split`), else a
    split stratified by ``labels`` (:func:`split_indices`); train keeps the rest. The order of each list
    is the rows' order.
    """
    left = list(range(n))
    out: dict[str, list[int]] = {"train": [], "val": [], "test": []}
    for s in ("test", "val"):
        if s in selected:
            wanted = set(selected[s])
            out[s] = [i for i in left if i in wanted]
            left = [i for i in left if i not in wanted]
    if any(fractions.values()):
        vf, tf = fractions.get("val", 0.0), fractions.get("test", 0.0)
        if groups is not None:
            parts = group_split([groups[i] for i in left], vf, tf, seed)
            for s in fractions:
                held = set(parts[s])
                out[s] = [i for i in left if groups[i] in held]
        else:
            rows = labels if labels is not None else ["0"] * n
            drawn = split_indices([rows[i] for i in left], vf, tf, seed)
            for s in fractions:
                out[s] = [left[j] for j in drawn[s]]
        held = {i for s in fractions for i in out[s]}
        left = [i for i in left if i not in held]
    out["train"] = left
    return out
