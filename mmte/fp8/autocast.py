"""``mmte.fp8.autocast``: the region in which converted linears run their GEMMs in FP8.

Inside ``with mmte.fp8.autocast(recipe=...)`` every :class:`~mmte.fp8.FP8Linear` runs FP8 GEMMs; outside
it the same modules are ordinary high-precision linears (TE's ``fp8_autocast`` contract). Wrap the
forward pass only; the backward pass uses the recipe its forward saw.

Unconverted linears: unlike TransformerEngine, where every ``te.Linear`` inside ``fp8_autocast`` runs in
FP8, a plain :class:`mmte.te.Linear` stays in high precision here — conversion (:func:`mmte.fp8.convert`)
is where the choice of which GEMMs run in FP8 is made (by default: the backbone's, not the tokenizers'
or heads'). A region in which no FP8 GEMM ran at all warns once, since it almost always means the model
was never converted.

Delayed-scaling bookkeeping, and why a module may run several times per step. Each module keeps, per
operand role (input, weight, output gradient), an amax history, a scale and a *pending* amax: the max
over every use since the last update. Every use in a step quantizes with the same (delayed) scale and
folds its amax into the pending one; the update happens once:

* forward roles (input, weight) when the outermost autocast region exits;
* the gradient role at the next outermost entry (after the backward of the previous step), or when
  :func:`update_scales` is called.

So a shared backbone called once per modality inside one region records ``max`` over all its passes —
TransformerEngine instead records one amax per forward and forbids a second call. Before each update
the pending amaxes of all modules are max-reduced across ``amax_reduction_group`` in one collective
(data- and tensor-parallel ranks must agree on scales); with ``group=None`` the default group is used
when torch.distributed is initialised and the recipe's ``reduce_amax`` is True. Every rank of the group
must run the same modules (under pipeline parallelism pass the stage's DP x TP group).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from .recipes import DelayedScaling, Recipe, make_recipe

__all__ = ["autocast", "get_fp8_context", "is_fp8_enabled", "reset_pending", "update_scales"]


@dataclass
class _Region:
    recipe: Recipe
    enabled: bool
    group: Any
    outermost: bool
    # modules whose forward amaxes are pending, in first-use order (the same on every rank)
    pending: dict[int, tuple[Any, Recipe, Any]] = field(default_factory=dict)
    fp8_gemms: int = 0  # FP8Linear forwards run inside the (outermost) region


class _State(threading.local):
    def __init__(self):
        self.stack: list[_Region] = []


_STATE = _State()
# modules whose gradient amaxes are pending: id -> (weakref, recipe, group); filled by backward passes
_PENDING_BWD: dict[int, tuple[weakref.ref, Recipe, Any]] = {}
_PENDING_LOCK = threading.Lock()


def get_fp8_context() -> _Region | None:
    """The innermost active FP8 region, or None outside any."""
    return _STATE.stack[-1] if _STATE.stack else None


def is_fp8_enabled() -> bool:
    r = get_fp8_context()
    return bool(r is not None and r.enabled)


_WARNED_NO_FP8 = False


def _count_gemm() -> None:
    if _STATE.stack:
        _STATE.stack[0].fp8_gemms += 1


def _register_forward(module, recipe: Recipe) -> None:
    if not _STATE.stack:
        return
    outer = _STATE.stack[0]
    if id(module) not in outer.pending:
        outer.pending[id(module)] = (module, recipe, _STATE.stack[-1].group)


def _register_backward(module, recipe: Recipe, group) -> None:
    with _PENDING_LOCK:
        if id(module) not in _PENDING_BWD:
            _PENDING_BWD[id(module)] = (weakref.ref(module), recipe, group)


def _resolve_group(group, recipe: Recipe):
    """The process group to reduce over, or None for no reduction."""
    if not (isinstance(recipe, DelayedScaling) and recipe.reduce_amax):
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    if group is None:
        return dist.group.WORLD
    return group


def _finalize(entries: list[tuple[Any, Recipe, Any]], roles: tuple[int, ...]) -> None:
    """Reduce the pending amaxes of ``roles`` across each group, then update histories and scales."""
    by_group: dict[int, list[tuple[Any, Recipe, Any]]] = {}
    for mod, recipe, group in entries:
        g = _resolve_group(group, recipe)
        by_group.setdefault(id(g) if g is not None else 0, []).append((mod, recipe, g))
    for items in by_group.values():
        g = items[0][2]
        if g is not None:
            import torch.distributed as dist

            flat = torch.cat([m.fp8_amax_pending[list(roles)] for m, _, _ in items])
            dist.all_reduce(flat, op=dist.ReduceOp.MAX, group=g)
            for i, (m, _, _) in enumerate(items):
                m.fp8_amax_pending[list(roles)] = flat[i * len(roles) : (i + 1) * len(roles)]
        for m, recipe, _ in items:
            m._fp8_update(recipe, roles)
    mods = [m for m, _, _ in entries]
    if mods:
        type(mods[0])._fp8_check_round(mods)  # FP8Linear's check (found on the module: this file stays below linear.py)


def _finalize_backward() -> None:
    with _PENDING_LOCK:
        items = list(_PENDING_BWD.values())
        _PENDING_BWD.clear()
    entries = [(ref(), recipe, group) for ref, recipe, group in items if ref() is not None]
    if entries:
        _finalize(entries, (2,))


def reset_pending() -> None:
    """Forget every pending gradient amax (not applied). Called when a training run ends: the next run's
    first autocast entry must not reduce amaxes of another run's modules — on some ranks only, as garbage
    collection decides which of them are still alive, which would leave the ranks' collectives unmatched."""
    with _PENDING_LOCK:
        _PENDING_BWD.clear()


def update_scales() -> None:
    """Apply every pending gradient-amax update now (normally done at the next autocast entry).

    Call it after the last backward pass before saving a checkpoint if the saved scales must include
    that step's gradients (the pending amaxes are saved either way and applied after loading).
    """
    if _STATE.stack:
        raise RuntimeError("update_scales() must be called outside mmte.fp8.autocast regions")
    _finalize_backward()


@contextlib.contextmanager
def autocast(enabled: bool = True, recipe: Recipe | str | None = None, amax_reduction_group=None, **recipe_kwargs):
    """Run converted linears in FP8 inside this region.

    Args:
        enabled: False runs them in high precision (a nested ``enabled=False`` region switches FP8 off).
        recipe: a :class:`~mmte.fp8.Recipe` or a short name (``"delayed"``, ``"current"``, ``"block"``,
            ``"mx"``); default :class:`~mmte.fp8.DelayedScaling`.
        amax_reduction_group: process group over which delayed-scaling amaxes are max-reduced before each
            update (default: the world group when torch.distributed is initialised).
        **recipe_kwargs: recipe fields when ``recipe`` is a name (``autocast(recipe="delayed", margin=1)``).
    """
    if recipe is None:
        recipe = DelayedScaling(**recipe_kwargs)
    else:
        recipe = make_recipe(recipe, **recipe_kwargs)
    outermost = not _STATE.stack
    if outermost:
        _finalize_backward()
    region = _Region(recipe, bool(enabled), amax_reduction_group, outermost)
    _STATE.stack.append(region)
    try:
        yield region
    finally:
        _STATE.stack.pop()
        if outermost and region.pending:
            _finalize(list(region.pending.values()), (0, 1))
        if outermost and enabled and region.fp8_gemms == 0:
            _warn_no_fp8()


def _warn_no_fp8() -> None:
    global _WARNED_NO_FP8
    if not _WARNED_NO_FP8:
        import warnings

        warnings.warn(
            "mmte.fp8.autocast: no FP8 GEMM ran in this region. Only FP8Linear modules run in FP8 (unlike "
            "TransformerEngine, a plain mmte.te.Linear stays in high precision): convert the model first with "
            "mmte.fp8.convert(model, recipe)",
            stacklevel=3,
        )
        _WARNED_NO_FP8 = True
