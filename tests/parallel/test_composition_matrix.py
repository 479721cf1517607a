"""The composition matrix: every ``configs/parallel`` fragment x {fp32, every ``configs/precision/fp8-*``
fragment} x {no adapter, LoRA}, through the real ``mmte fit`` on the quickstart recipe with a tiny 4-layer
backbone. Every combination trains, writes a checkpoint, keeps frozen what the freeze policy froze, trains the
LoRA adapters (they are in the checkpoint and moved), and its first loss is one process's (fp32 1e-4;
FP8: 2e-3, as scales are reduced over the data-parallel group the quantisation grid is the same; block and
MX scaling under tensor parallelism tile each rank's shard of the contraction dimension, another grid than
one process's, so there the bound is the larger of 2e-3 and one process's own FP8 error on that loss,
|fp8 - fp32|: measured 2.7e-3 against an FP8 error of 5.1e-3 for fp8-block on tp2).

One launch per world size runs every cell of that size (tests/parallel/conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ._launch import REPO
from ._plans import ADAPTERS, FP8, PARALLEL, PRECISIONS, dims, dp, plan, world_size


# ------------------------------------------------------------------------------------------------- matrix
def _matrix_args(tmp: Path, name: str, precision: str, adapter: str, dp: int) -> list[str]:
    args = ["--config", str(REPO / "recipes" / "quickstart.yaml"), "--config", str(REPO / "configs" / "encoders" / "tiny.yaml"),
            "--model.backbone", "{preset: tiny, num_layers: 4}", "--precision", "32-true"]
    args += ["--config", str(REPO / "configs" / "models" / "lora.yaml")] if adapter == "lora" else ["--model.lora", "null"]
    if precision != "fp32":
        args += ["--config", str(FP8[precision])]
    # no validation: the equivalence runs (test_composition.py) validate under every fragment; a cell checks training
    return args + ["--trainer.max_steps", "1", "--trainer.limit_val_batches", "0", "--trainer.num_sanity_val_steps", "0", "--trainer.enable_progress_bar", "false",
                   "--trainer.enable_model_summary", "false", "--data.init_args.batch_size", str(32 // dp),
                   "--data.init_args.eval_batch_size", "64", "--trainer.default_root_dir", str(tmp / name)]


def _check_lora(run_dir: Path, name: str) -> None:
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    lora = {k: v for k, v in ckpt["state_dict"].items() if ".lora." in k}
    assert lora, (name, "no LoRA tensors in the checkpoint")
    b = [v for k, v in lora.items() if k.endswith(".lora.B")]
    assert b and all(float(v.abs().sum()) > 0 for v in b), (name, "LoRA B stayed at its zero init: the adapters did not train")


@plan("test_fragment_precision_adapter_matrix")
def _plan_matrix(tmp: Path, world: int) -> dict[int, dict[str, list[str]]]:
    """One process's run of every precision x adapter combination (the references), and every cell of the
    fragments of ``world`` processes."""
    one = {f"matrix-one-{p}-{a}": _matrix_args(tmp, f"matrix-one-{p}-{a}", p, a, 1) for p in PRECISIONS for a in ADAPTERS}
    cells = {f"matrix-{frag}-{p}-{a}": _matrix_args(tmp, f"matrix-{frag}-{p}-{a}", p, a, dp(frag)) + ["--config", str(PARALLEL[frag])]
             for frag in PARALLEL if world_size(frag) == world for p in PRECISIONS for a in ADAPTERS}
    return {1: one, world: cells}


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("world", sorted({world_size(f) for f in PARALLEL}))
def test_fragment_precision_adapter_matrix(world, runs):
    failures = []
    cells = 0
    for frag in (f for f in PARALLEL if world_size(f) == world):
        for p in PRECISIONS:
            for a in ADAPTERS:
                name, key = f"matrix-{frag}-{p}-{a}", f"{p}-{a}"
                cells += 1
                try:
                    ref, r = runs[f"matrix-one-{key}"], runs[name]
                    assert sorted(r["trainable_abs_sums"]) == sorted(ref["trainable_abs_sums"]), "trainable parameters differ from one process"
                    tol = 1e-4 if p == "fp32" else 2e-3
                    if p in ("fp8-block", "fp8-mx") and dims(frag).tp > 1:  # per-shard tiles: another grid
                        tol = max(tol, abs(ref["losses"][0] - runs[f"matrix-one-fp32-{a}"]["losses"][0]))
                    assert abs(r["losses"][0] - ref["losses"][0]) <= tol, ("first loss", r["losses"][0], ref["losses"][0])
                    if a == "lora":
                        _check_lora(runs.tmp / name, name)
                except AssertionError as e:
                    failures.append(f"{name}: {e}")
    assert cells == len(PRECISIONS) * len(ADAPTERS) * sum(world_size(f) == world for f in PARALLEL) > 0
    assert not failures, "\n".join(failures)
