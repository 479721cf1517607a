"""Model outputs -> JSON answers: the rows ``mmte predict`` writes to ``predictions.csv``, one per item.

The columns are the prediction writer's (:class:`~mmte.training.callbacks.PredictionWriter`): per head
the class name ``pred`` and its probability ``prob`` (rounded to 6 digits, as in the file), or a
regression ``value``, or a forecast array; a model with several heads prefixes them ``<head>_``.
``top_k`` adds ``top_k`` (or ``<head>_top_k``): the k most probable classes with their probabilities.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["prediction_rows"]


def prediction_rows(res: Mapping[str, Any], ids: Sequence[str], class_names: Sequence[str] | None, top_k: Sequence[int | None] | int = 0) -> list[dict[str, Any]]:
    """``predict_step``'s output for a batch -> one JSON-ready row per item, as ``mmte predict`` writes them.

    Args:
        res: ``{head: {"pred", "prob"} | {"value"}, "index"?: ...}`` (:meth:`MMTEModule.predict_step`).
        ids: each item's id (the uploaded file's name, the row id...), the ``id`` column.
        class_names: the checkpoint's class names (None: class ids).
        top_k: per item (or for all) how many classes with their probabilities to add (0 or None: none).
    """
    # the prediction writer's own column assembly, so a row here is a row of predictions.csv
    from ..training.callbacks import PredictionWriter, batch_columns, plain_value

    _, cols, n = batch_columns({k: v for k, v in res.items() if k != "index"})
    table = PredictionWriter.assemble({"id": list(ids)}, cols, list(class_names) if class_names else None)
    rows = [{k: plain_value(v[i]) for k, v in table.items()} for i in range(n)]
    ks = [top_k] * n if isinstance(top_k, int) or top_k is None else list(top_k)
    heads = [h for h in res if h != "index"]
    for h in heads:
        o = res[h]
        if not isinstance(o, Mapping) or "prob" not in o:
            continue
        prob = o["prob"].detach().float().cpu().numpy()
        key = f"{h}_top_k" if len(heads) > 1 else "top_k"
        for i, k in enumerate(ks):
            if not k:
                continue
            order = np.argsort(-prob[i], kind="stable")[: int(k)]
            rows[i][key] = [{"class": _name(int(c), class_names), "prob": round(float(prob[i][c]), 6)} for c in order]
    return rows


def _name(c: int, class_names: Sequence[str] | None) -> Any:
    return class_names[c] if class_names and 0 <= c < len(class_names) else c
