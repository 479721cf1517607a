"""The Hugging Face data path in the composition matrix: :class:`~mmte.training.data.HFDataModule` on generated
parquet shards (a classification table: four numbers, a category, a ``ClassLabel`` label), read map-style and
streamed, trains through the real ``mmte fit`` under ``configs/parallel/ddp.yaml`` and ``fsdp.yaml`` (2
processes) with per-step losses equal to one process's within the composition tests' 1e-4 (fp32, the same
global batch: each rank takes batch/dp), and the same trained weights within 1e-3.

Why the global batches are the same: map-style, the training sampler draws one seeded permutation and rank
``r`` takes every dp-th index of it, so a step's ranks together hold one process's batch. Streamed, every
rank shuffles the same stream (shard order and buffer seeded alike); with a shard count that is not a
multiple of the ranks (3 shards here), ``split_dataset_by_node`` gives rank ``r`` every dp-th row of it, so
again a step's ranks together hold one process's batch. (With a multiple, each rank reads whole shards of its
own: every row once an epoch, as ``tests/training/test_hf_stream.py`` asserts, but other batches than one
process's.) The head has no dropout, so the ranks' random streams do not enter the loss.

The runs of the selected cases share one launch per world size (the ``runs`` fixture, tests/parallel/conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.parallel._plans import PARALLEL, dp, plan, world_size, worst_gap
from tests.training.hf_fixtures import table_config, write_table_shards

ROWS, SHARDS, BATCH, STEPS = 192, 3, 16, 6
CASES = [("ddp", "map"), ("ddp", "stream"), ("fsdp", "map"), ("fsdp", "stream")]


def _args(tmp: Path, name: str, read: str, dp: int) -> list[str]:
    return ["--config", str(tmp / "hf.yaml"), "--data.init_args.streaming", str(read == "stream").lower(),
            "--data.init_args.batch_size", str(BATCH // dp), "--trainer.max_steps", str(STEPS), "--trainer.limit_val_batches", "1",
            "--trainer.default_root_dir", str(tmp / name)]


@plan("test_hf_data_under_a_parallel_fragment_trains_like_one_process")
def _plan_hf(tmp: Path, case: tuple[str, str]) -> dict[int, dict[str, list[str]]]:
    """One process's run of the case's way of reading, and the case under its fragment (the shards and the
    recipe file are written once, under the file's run folder)."""
    if not (tmp / "hf.yaml").is_file():
        write_table_shards(tmp / "shards", ROWS, SHARDS)
        (tmp / "hf.yaml").write_text(yaml.safe_dump(table_config(tmp / "shards", streaming=False, batch_size=BATCH, head_dropout=0.0)))
    frag, read = case
    return {1: {f"hf-one-{read}": _args(tmp, f"hf-one-{read}", read, 1)},
            world_size(frag): {f"hf-{frag}-{read}": _args(tmp, f"hf-{frag}-{read}", read, dp(frag)) + ["--config", str(PARALLEL[frag])]}}


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("case", CASES, ids=[f"{f}-{r}" for f, r in CASES])
def test_hf_data_under_a_parallel_fragment_trains_like_one_process(case, runs):
    frag, read = case
    ref, r = runs[f"hf-one-{read}"], runs[f"hf-{frag}-{read}"]
    assert len(r["losses"]) == len(ref["losses"]) == STEPS, (r["losses"], ref["losses"])
    worst = worst_gap(r["losses"], ref["losses"])
    assert worst <= 1e-4, (frag, read, worst, r["losses"], ref["losses"])
    assert sorted(r["trainable_abs_sums"]) == sorted(ref["trainable_abs_sums"])
    for k, v in ref["trainable_abs_sums"].items():
        assert r["trainable_abs_sums"][k] == pytest.approx(v, rel=1e-3, abs=1e-3), (frag, read, k)
