"""What the composition test files share: the shipped parallel and FP8 fragments, their world sizes and
dimensions, the loss comparison, and the plan registry behind the ``runs`` fixture (tests/parallel/conftest.py).

A multi-process test names its runs with :func:`plan`: ``plan(test name)`` registers a function
``(tmp, **the test's parameters) -> {world size: {run name: mmte fit arguments}}``. The module fixture ``runs``
starts ONE launch per world size over the planned runs of the selected tests of its file, so each file pays
one start-up (imports, process group) per world size rather than one per test. Run names are unique across
files; each run writes under ``tmp / name``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from ._launch import REPO

PARALLEL = {p.stem: p for p in sorted((REPO / "configs" / "parallel").glob("*.yaml"))}
FP8 = {p.stem: p for p in sorted((REPO / "configs" / "precision").glob("fp8-*.yaml"))}
PRECISIONS = ["fp32", *FP8]
ADAPTERS = ["none", "lora"]
ETT = REPO.parent / "shared" / "data" / "ett" / "ETTh1.csv"
FSDD = REPO.parent / "shared" / "data" / "fsdd" / "recordings"

#: ``PLANS[test name](tmp, **its parameters) -> {world size: {run name: args}}``
PLANS: dict[str, Callable[..., dict[int, dict[str, list[str]]]]] = {}


def plan(test: str):
    """Register the decorated function as the run plan of the test function named ``test``."""
    def register(fn):
        PLANS[test] = fn
        return fn
    return register


def world_size(fragment: str) -> int:
    """The number of processes the fragment's ``trainer.devices`` asks for."""
    return int(yaml.safe_load(PARALLEL[fragment].read_text())["trainer"]["devices"])


def dims(fragment: str):
    """The fragment's parallel dimensions, resolved for its world size (``.dp``, ``.tp``, ``.pp``...)."""
    from mmte.training.strategy import MMTEStrategy

    s = MMTEStrategy(**yaml.safe_load(PARALLEL[fragment].read_text())["trainer"]["strategy"]["init_args"])
    return s.dims.resolve(world_size(fragment))


def dp(fragment: str) -> int:
    """The fragment's data-parallel degree: a run under it takes batch / dp per rank, one global batch."""
    return dims(fragment).dp


def worst_gap(losses: list[float], want: list[float]) -> float:
    """The largest per-step loss difference, relative to the loss (absolute below 1)."""
    return max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(losses, want))


def checked(result: dict, name: str) -> dict:
    """``result`` after checking the run ended without an error, wrote ``last.ckpt`` and logged finite losses."""
    assert "error" not in result, (name, result.get("error"))
    assert "last.ckpt" in result["checkpoints"], (name, result["checkpoints"])
    assert result["losses"] and all(math.isfinite(x) for x in result["losses"]), (name, result["losses"])
    return result


@dataclass
class Runs:
    """The results of a file's launches: ``tmp`` (the run folders' parent), ``results[name]``, and why a
    launch failed (by world size; empty when it did not)."""

    tmp: Path
    results: dict[str, dict]
    failures: dict[int, str]
    world_of: dict[str, int]

    def __getitem__(self, name: str) -> dict:
        """The run's result, checked (:func:`checked`); a run its launch never reached fails with the launch's reason."""
        assert name in self.results, (name, self.failures.get(self.world_of.get(name, 0), "not planned"))
        return checked(self.results[name], name)


STEPS = 6  # the equivalence runs: every fragment's per-step losses against one process's


def recipe_args(recipe: str, tmp: Path, name: str, dp: int, steps: int = STEPS) -> list[str]:
    """``mmte fit`` arguments of a shipped recipe (``quickstart`` or ``etth1_forecast``) for ``steps`` fp32
    steps with a global batch of 64 (``64 // dp`` per rank), validating on one batch, writing under ``tmp / name``.
    ETTh1 gets 4 layers, so a V-shaped pipeline has a layer per stage, and no head dropout (ranks draw differently)."""
    args = ["--config", str(REPO / "recipes" / f"{recipe}.yaml"), "--precision", "32-true",
            "--trainer.max_steps", str(steps), "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false", "--trainer.log_every_n_steps", "1",
            "--trainer.default_root_dir", str(tmp / name)]
    if recipe == "quickstart":
        return args + ["--data.init_args.batch_size", str(64 // dp)]
    return args + ["--data.init_args.path", str(ETT), "--data.init_args.batch_size", str(64 // dp),
                   "--model.backbone", "{preset: tiny, num_layers: 4}", "--model.heads.forecast.dropout", "0.0"]
