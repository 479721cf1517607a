"""Pipeline parallelism: split a model into stages by FQN lists and run a ``torch.distributed.pipelining``
schedule over them.

Splitting
    A model is cut along its backbone's ``layers.{i}``: tokenizers (and ``norm_pre``) go to the first
    stage, heads/losses (and the final ``norm``) to the last, and the layers are spread so that the
    stages are balanced by layer count or by parameter count. A stage is a *pruned view* of the model:
    container modules (the root, the backbone, its ``layers`` dict) are shallow-copied with only the
    stage's children, while the leaves (layers, tokenizers, heads) are shared with the rank's local
    model. FQNs are therefore unchanged — checkpoints written under PP load without it — and the model's
    own ``forward`` runs the stage, as long as it skips the parts that are ``None`` (``Backbone`` does).

Schedules (``p`` ranks, ``m`` microbatches)
    ======================  ==================  ============================================
    name                    stages per rank     bubble (equal F/B costs)
    ======================  ==================  ============================================
    ``gpipe``               1                   (p-1)/(m+p-1)
    ``1f1b``                1                   (p-1)/(m+p-1), less activation memory
    ``interleaved_1f1b``    v (virtual)         (p-1)/(v*m+p-1)
    ``looped_bfs``          v                   (p-1)/(v*m+p-1)
    ``interleaved_zb``      v                   ~0 when F = B_input = B_weight
    ``zbv``                 2 (V-shape)         ~0 when F = B_input = B_weight
    ``dualpipev``           2 (V-shape)         DualPipe's, halved parameters per rank
    ======================  ==================  ============================================

Looped schedules place stage ``s`` on rank ``s % p``; V-shaped ones place ranks ``r`` and ``2p-1-r``
together, so the first and the last stage share rank 0.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence

import torch
from torch import nn

logger = logging.getLogger(__name__)

__all__ = [
    "SCHEDULES",
    "bubble_fraction",
    "build_schedule",
    "forward_only",
    "layer_costs",
    "make_stage_module",
    "microbatches_for",
    "partition",
    "pipeline_split",
    "schedule_accepts",
    "stage_fqns",
    "stage_ids",
    "stage_owners",
    "stages_per_rank",
]

SCHEDULES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved_1f1b": "ScheduleInterleaved1F1B",
    "looped_bfs": "ScheduleLoopedBFS",
    "interleaved_zb": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
    "dualpipev": "ScheduleDualPipeV",
}
_SINGLE = ("gpipe", "1f1b")
_V_STYLE = ("zbv", "dualpipev")


def _check_schedule(name: str) -> str:
    key = name.lower().replace("-", "_")
    if key not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {name!r}; expected one of {sorted(SCHEDULES)}")
    return key


def stages_per_rank(schedule: str, virtual_stages: int = 2) -> int:
    """How many stages each rank holds under ``schedule``."""
    key = _check_schedule(schedule)
    if key in _SINGLE:
        return 1
    if key in _V_STYLE:
        return 2
    if not isinstance(virtual_stages, int) or virtual_stages < 1:
        raise ValueError(f"virtual_stages must be a positive int; got {virtual_stages!r}")
    return virtual_stages


def stage_ids(schedule: str, pp_rank: int, pp_size: int, virtual_stages: int = 2) -> list[int]:
    """Global stage indices held by ``pp_rank`` (looped: ``r, r+p, ...``; V: ``r, 2p-1-r``)."""
    key = _check_schedule(schedule)
    v = stages_per_rank(key, virtual_stages)
    if key in _V_STYLE:
        return [pp_rank, 2 * pp_size - 1 - pp_rank]
    return [pp_rank + i * pp_size for i in range(v)]


def bubble_fraction(schedule: str, pp_size: int, microbatches: int, virtual_stages: int = 2) -> float:
    """Theoretical idle fraction of a schedule with equal forward/backward costs (see the module table)."""
    key = _check_schedule(schedule)
    p, m = pp_size, microbatches
    if key in _SINGLE:
        return (p - 1) / (m + p - 1)
    if key in ("interleaved_1f1b", "looped_bfs"):
        return (p - 1) / (virtual_stages * m + p - 1)
    if key in _V_STYLE or key == "interleaved_zb":
        # the ideal of the zero-bubble papers (F = B = W and m >= 2p): the bubble is filled with W work
        return 0.0
    raise AssertionError(key)  # pragma: no cover


# ----------------------------------------------------------------------------------------------- split
def _find_backbone(model: nn.Module) -> tuple[str, nn.Module]:
    from .tp import find_backbones

    found = find_backbones(model)
    if len(found) != 1:
        raise ValueError(f"pipeline splitting needs exactly one Backbone in the model; found {len(found)}")
    return found[0]


def layer_costs(model: nn.Module, balance: str | Sequence[float] = "layers") -> list[float]:
    """Relative cost of each backbone layer: training compute (``"compute"``: 3 for a layer with trainable
    parameters, 2 for a frozen one, which still computes input gradients), 1 each (``"layers"``),
    parameter count (``"params"``), or given."""
    _, bb = _find_backbone(model)
    n = len(bb.layers)
    if isinstance(balance, str):
        if balance == "compute":
            # a trainable layer runs forward, input-gradient and weight-gradient GEMMs (~3 units); a frozen one
            # forward and input-gradient only (~2): balances trainable work when only part of the backbone trains
            return [3.0 if any(p.requires_grad for p in layer.parameters()) else 2.0 for layer in bb.layers.values()]
        if balance == "layers":
            return [1.0] * n
        if balance == "params":
            return [float(sum(p.numel() for p in layer.parameters())) for layer in bb.layers.values()]
        raise ValueError(f"balance must be 'compute', 'layers', 'params' or a list of per-layer weights; got {balance!r}")
    w = [float(x) for x in balance]
    if len(w) != n or any(x <= 0 for x in w):
        raise ValueError(f"balance weights must be {n} positive numbers (one per layer); got {list(balance)}")
    return w


def partition(costs: Sequence[float], parts: int) -> list[list[int]]:
    """Split ``range(len(costs))`` into ``parts`` contiguous non-empty runs minimising the largest sum."""
    n = len(costs)
    if parts < 1 or parts > n:
        raise ValueError(f"cannot split {n} layers into {parts} pipeline stages (each stage needs at least one layer)")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[k][i]: minimal max-cost splitting the first i items into k runs
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n - (parts - k) + 1):
            for j in range(k - 1, i):
                v = max(best[k - 1][j], prefix[i] - prefix[j])
                if v < best[k][i] - 1e-12:
                    best[k][i], cut[k][i] = v, j
    runs, i = [], n
    for k in range(parts, 0, -1):
        j = cut[k][i]
        runs.append(list(range(j, i)))
        i = j
    return runs[::-1]


def stage_fqns(
    model: nn.Module,
    num_stages: int,
    *,
    balance: str | Sequence[float] = "layers",
    first: Sequence[str] | None = None,
    last: Sequence[str] | None = None,
) -> list[list[str]]:
    """Module FQNs held by each pipeline stage.

    Args:
        model: the whole model (a ``Backbone`` or a model containing exactly one).
        num_stages: total stages (``pp * stages_per_rank``).
        balance: ``"layers"`` (equal layer counts), ``"params"`` or per-layer weights.
        first, last: top-level children for the first / last stage; by default children whose name
            contains ``token``/``embed``/``stem`` go first and every other non-backbone child goes last.

    Returns:
        ``num_stages`` lists of FQNs (e.g. ``[["tokenizer", "backbone.layers.0"], ["backbone.layers.1",
        "backbone.norm", "head"]]``).
    """
    bb_fqn, bb = _find_backbone(model)
    pre = f"{bb_fqn}." if bb_fqn else ""
    keys = list(bb.layers.keys())
    runs = partition(layer_costs(model, balance), num_stages)
    stages = [[f"{pre}layers.{keys[i]}" for i in run] for run in runs]
    if getattr(bb, "norm_pre", None) is not None:
        stages[0].insert(0, f"{pre}norm_pre")
    if getattr(bb, "norm", None) is not None:
        stages[-1].append(f"{pre}norm")
    if bb_fqn:
        top = bb_fqn.split(".")[0]
        others = [n for n, m in model.named_children() if n != top and m is not None]
        if first is None:
            first = [n for n in others if any(t in n.lower() for t in ("token", "embed", "stem"))]
        if last is None:
            last = [n for n in others if n not in first]
        unknown = sorted((set(first) | set(last)) - set(others))
        if unknown:
            raise ValueError(f"first/last name unknown children {unknown}; the model's children are {others}")
        stages[0] = list(first) + stages[0]
        stages[-1] = stages[-1] + list(last)
    return stages


def make_stage_module(model: nn.Module, keep: Sequence[str]) -> nn.Module:
    """A pruned view of ``model`` holding only ``keep`` (FQNs); leaves are shared, containers copied.

    Children not kept are set to ``None`` (or removed from a ``ModuleDict``). ``ModuleList`` containers
    on the path are refused (removing entries would renumber the FQNs).
    """
    keep = list(keep)
    names = {n for n, _ in model.named_modules()}
    missing = [k for k in keep if k not in names]
    if missing:
        raise ValueError(f"stage FQNs {missing} are not modules of {type(model).__name__}")
    if "" in keep:
        return model

    def prune(mod: nn.Module, prefix: str) -> nn.Module:
        new = copy.copy(mod)
        new._modules = dict(mod._modules)
        if isinstance(mod, nn.ModuleList):
            raise TypeError(f"cannot pipeline-split inside an nn.ModuleList at {prefix or '<root>'!r}; use nn.ModuleDict")
        for name, child in list(mod._modules.items()):
            full = prefix + name
            if child is None or full in keep:
                continue
            if any(k.startswith(full + ".") for k in keep):
                new._modules[name] = prune(child, full + ".")
            elif isinstance(mod, nn.ModuleDict):
                del new._modules[name]
            else:
                new._modules[name] = None
        return new

    return prune(model, "")


def pipeline_split(
    model: nn.Module,
    pp_rank: int,
    pp_size: int,
    *,
    schedule: str = "1f1b",
    virtual_stages: int = 2,
    balance: str | Sequence[float] = "layers",
    first: Sequence[str] | None = None,
    last: Sequence[str] | None = None,
) -> tuple[nn.Module, list[tuple[int, nn.Module]], int]:
    """This rank's share of a pipelined model.

    Returns:
        ``(local, stages, num_stages)``: ``local`` is the model pruned to every module this rank holds
        (what optimisers and checkpoints see; FQNs unchanged), ``stages`` are ``(stage_index, module)``
        views sharing ``local``'s leaves, in the order the schedule expects.
    """
    if pp_size < 1 or not 0 <= pp_rank < pp_size:
        raise ValueError(f"pp_rank must be in [0, {pp_size}); got {pp_rank}")
    v = stages_per_rank(schedule, virtual_stages)
    num_stages = pp_size * v
    _, bb = _find_backbone(model)
    if num_stages > len(bb.layers):
        raise ValueError(
            f"pp={pp_size} x {v} stage(s) per rank = {num_stages} pipeline stages is more than the "
            f"{len(bb.layers)} backbone layers (each stage needs at least one layer)"
        )
    direct = [n for n, _ in model.named_parameters(recurse=False)]
    if direct:
        raise ValueError(f"pipeline splitting needs parameters inside submodules; {type(model).__name__} owns {direct} directly")
    all_fqns = stage_fqns(model, num_stages, balance=balance, first=first, last=last)
    ids = stage_ids(schedule, pp_rank, pp_size, virtual_stages)
    mine = [f for i in ids for f in all_fqns[i]]
    local = make_stage_module(model, mine)
    stages = [(i, make_stage_module(local, all_fqns[i])) for i in ids]
    for i, view in stages:
        if hasattr(view, "pipeline_stage"):  # models with a stage-aware forward (MetaTransformer)
            view.pipeline_stage = i
    logger.info(
        "pipeline split into %d stages (%s, balance=%s); rank %d holds stages %s: %s",
        num_stages,
        schedule,
        balance if isinstance(balance, str) else "weights",
        pp_rank,
        ids,
        [all_fqns[i] for i in ids],
    )
    if not any(p.requires_grad for p in local.parameters()):
        logger.info(
            "pipeline rank %d holds nothing to train (frozen layers only): it runs forward and passes input gradients back; "
            "to give it trainable work, unfreeze layers it holds or place trainable parts with pp_first/pp_last",
            pp_rank,
        )
    return local, stages, num_stages


def stage_owners(schedule: str, pp_size: int, virtual_stages: int = 2) -> dict[int, int]:
    """``{stage index: pp rank}`` for every stage of the pipeline."""
    return {i: r for r in range(pp_size) for i in stage_ids(schedule, r, pp_size, virtual_stages)}


@torch.no_grad()
def forward_only(stage_modules: Sequence[tuple[int, nn.Module]], owners: dict[int, int], pp_group, *args, **kwargs):
    """Run the whole batch forward through the stages in order, without microbatches or a schedule
    (evaluation): each rank runs the stages it holds and sends the result to the next stage's rank as
    an object (``send_object_list``). Works for every placement (looped or V-shaped) and any batch size.

    Args:
        stage_modules: ``(stage_index, module)`` this rank holds.
        owners: ``{stage index: pp rank}`` (:func:`stage_owners`).
        pp_group: the pipeline process group.
        *args, **kwargs: the first stage's inputs (used where stage 0 lives).

    Returns:
        the last stage's output on the rank holding it, else None.
    """
    import torch.distributed as dist

    mine = dict(stage_modules)
    me = dist.get_rank(pp_group)
    out = None
    for s in range(len(owners)):
        if owners[s] != me:
            continue
        if s == 0:
            out = mine[s](*args, **kwargs)
        else:
            if owners[s - 1] != me:
                box = [None]
                dist.recv_object_list(box, src=dist.get_global_rank(pp_group, owners[s - 1]), group=pp_group)
                out = box[0]
            out = mine[s](*(out if isinstance(out, (tuple, list)) else (out,)))
        if s + 1 < len(owners) and owners[s + 1] != me:
            dist.send_object_list([out], dst=dist.get_global_rank(pp_group, owners[s + 1]), group=pp_group)
    return out if owners[len(owners) - 1] == me else None


def schedule_accepts(schedule: str, microbatches: int, pp_size: int, num_stages: int) -> bool:
    """Whether ``schedule`` runs with ``microbatches`` microbatches (torch's own constraints)."""
    key = _check_schedule(schedule)
    if microbatches < 1:
        return False
    if key == "1f1b" or key in _V_STYLE:
        return microbatches >= num_stages
    if key in ("interleaved_1f1b", "interleaved_zb", "looped_bfs"):
        return microbatches % pp_size == 0
    return True


def microbatches_for(batch_size: int, schedule: str, microbatches: int, pp_size: int, num_stages: int) -> int | None:
    """How many microbatches a training batch of ``batch_size`` samples is split into: the largest count
    not above ``microbatches`` that divides the batch evenly (pipeline stages fix their tensor shapes, so
    every microbatch has the same size) and that the schedule accepts; None when there is none."""
    for m in range(min(microbatches, batch_size), 0, -1):
        if batch_size % m == 0 and schedule_accepts(schedule, m, pp_size, num_stages):
            return m
    return None


def build_schedule(
    stage_modules: Sequence[tuple[int, nn.Module]],
    num_stages: int,
    pp_group,
    *,
    schedule: str = "1f1b",
    microbatches: int = 4,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    device: torch.device | str = "cpu",
    scale_grads: bool = True,
):
    """Wrap stage modules in ``PipelineStage`` and build the named schedule.

    Args:
        stage_modules: ``(stage_index, module)`` for this rank (from :func:`pipeline_split`).
        num_stages: total stages.
        pp_group: the pipeline process group (``mesh["pp"].get_group()``).
        schedule: a key of :data:`SCHEDULES`.
        microbatches: microbatches per step (the batch must divide into them).
        loss_fn: ``loss_fn(output, target)`` on the last stage, mean over the microbatch; gradients are
            averaged over microbatches (``scale_grads``) so they equal the full batch's.
        device: the stage device.

    Returns:
        ``(schedule, stages)``; call ``schedule.step(inputs, target=..., losses=[])``.
    """
    import torch.distributed.pipelining as pl
    from torch.distributed.pipelining import PipelineStage

    key = _check_schedule(schedule)
    if not isinstance(microbatches, int) or microbatches < 1:
        raise ValueError(f"microbatches must be a positive int; got {microbatches!r}")
    pp = num_stages // max(len(stage_modules), 1)
    if key == "dualpipev" and microbatches < num_stages:
        raise ValueError(f"dualpipev needs microbatches >= stages; got {microbatches} microbatches for {num_stages} stages")
    if key in ("interleaved_1f1b", "interleaved_zb", "looped_bfs") and microbatches % pp:
        raise ValueError(f"{key} needs microbatches divisible by pp={pp}; got {microbatches}")
    device = torch.device(device)
    stages = [PipelineStage(m, i, num_stages, device, group=pp_group) for i, m in stage_modules]
    cls = getattr(pl, SCHEDULES[key], None)
    if cls is None:  # some torch versions only export it from the schedules module
        from torch.distributed.pipelining import schedules as sch

        cls = getattr(sch, SCHEDULES[key])
    if key in _SINGLE:
        if len(stages) != 1:
            raise ValueError(f"{key} runs one stage per rank; got {len(stages)}")
        sched = cls(stages[0], n_microbatches=microbatches, loss_fn=loss_fn, scale_grads=scale_grads)
    else:
        sched = cls(stages, n_microbatches=microbatches, loss_fn=loss_fn, scale_grads=scale_grads)
    logger.info("pipeline schedule %s: %d stages, %d microbatches", cls.__name__, num_stages, microbatches)
    return sched, stages
