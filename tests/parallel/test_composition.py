"""Every ``configs/parallel`` fragment trains the shipped recipes like one process, through the real ``mmte
fit`` (the CLI class, in-process under ``torchrun``) on ``MMTEModule`` / ``MetaTransformer``; never a toy module.

* Equivalence: the quickstart (frozen pretrained MiniLM) and the ETTh1 forecaster (trainable 4-layer
  backbone, channel-independent patches, RevIN) train 6 steps under every fragment and their per-step
  losses equal one process's within 1e-4 (fp32, same global batch: data-parallel runs take batch/dp per
  rank), with the same trainable parameters and trained weights.
* Refusals: combinations that cannot work fail before any process starts, with the reason asserted.

The fragment x precision x adapter matrix is in ``test_composition_matrix.py``; model options under the
fragments (mixup, the speaker recipe's stem, the weight average, other pipeline schedules, joint fusion) in
``test_composition_options.py``. Each file's multi-process runs share one launch per world size (the
``runs`` fixture, tests/parallel/conftest.py), and the files run on different test workers.
"""

from __future__ import annotations

import pytest

from ._launch import REPO
from ._plans import ETT, PARALLEL, STEPS, dp, plan, recipe_args, world_size, worst_gap


@plan("test_every_parallel_fragment_trains_like_one_process")
def _plan_every_fragment(tmp, recipe: str) -> dict[int, dict[str, list[str]]]:
    if recipe == "etth1_forecast" and not ETT.is_file():
        return {}
    out = {1: {f"eq-{recipe}-one": recipe_args(recipe, tmp, f"eq-{recipe}-one", 1)}}
    for frag, fragment_file in PARALLEL.items():
        name = f"eq-{recipe}-{frag}"
        out.setdefault(world_size(frag), {})[name] = recipe_args(recipe, tmp, name, dp(frag)) + ["--config", str(fragment_file)]
    return out


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("recipe", ["quickstart", "etth1_forecast"])
def test_every_parallel_fragment_trains_like_one_process(recipe, runs):
    if recipe == "etth1_forecast":
        from tests.conftest import need_data

        need_data(ETT, "ETTh1")
    ref = runs[f"eq-{recipe}-one"]
    assert len(ref["losses"]) == STEPS
    for frag in PARALLEL:
        r = runs[f"eq-{recipe}-{frag}"]
        assert len(r["losses"]) == STEPS, (frag, r["losses"])
        # fp32 sums in another order (TP splits the GEMM reductions): 1e-4 relative to the loss
        worst = worst_gap(r["losses"], ref["losses"])
        assert worst <= 1e-4, (frag, worst, r["losses"], ref["losses"])
        assert sorted(r["trainable_abs_sums"]) == sorted(ref["trainable_abs_sums"]), frag  # freeze policy held
        for k, v in ref["trainable_abs_sums"].items():  # the trained weights themselves
            assert r["trainable_abs_sums"][k] == pytest.approx(v, rel=1e-3, abs=1e-3), (frag, k)


# ----------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    "extra, message",
    [
        (["--config", "configs/parallel/pp2-zbv.yaml", "--config", "configs/encoders/tiny.yaml"],
         ("pp=2 x 2 stage(s) per rank = 4 pipeline stages is more than the 2 backbone layers (each stage needs at least one "
          "layer): use a backbone with at least 4 layers (model.backbone, e.g. {preset: tiny, num_layers: 4}) or a schedule "
          "with one stage per rank (pp_schedule: 1f1b), or a smaller pp")),
        (["--config", "configs/parallel/tp2.yaml", "--config", "configs/encoders/tiny.yaml", "--model.backbone",
          "{preset: tiny, num_attention_heads: 1, hidden_size: 64}"],
         "tp=2 does not divide the number of attention heads 1"),
        (["--config", "configs/parallel/pp2-1f1b.yaml", "--trainer.devices", "3"],
         "dp_replicate*dp_shard*tp*pp = 1*1*1*2 = 2 differs from the world size 3"),
    ],
    ids=["zbv-needs-4-layers", "tp-heads", "world-size"],
)
def test_impossible_combinations_are_refused_before_start(extra, message, tmp_path, capsys, monkeypatch):
    from mmte.cli import main

    monkeypatch.chdir(REPO)
    rc = main(["fit", "--config", "recipes/quickstart.yaml", *extra, "--trainer.default_root_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"mmte: error: {message}" in err, err
    assert not (tmp_path / "run").exists()  # nothing was started or written


def test_pipeline_refuses_separate_fusion_predict_and_mixup(tmp_path):
    from mmte.training.module import MMTEModule
    from mmte.training.strategy import MMTEStrategy

    img = {"name": "image", "img_size": 8, "patch_size": 4, "in_chans": 1}
    clip = MMTEModule({"a": img, "b": img}, {"preset": "tiny", "num_layers": 4}, {"c": {"name": "contrastive", "embed_dim": 8}},
                      fusion="separate", freeze="none")
    with pytest.raises(ValueError, match=r"fusion 'separate' \(each modality through the backbone on its own, e\.g\. contrastive pairs\) cannot be pipelined"):
        MMTEStrategy(pp=2, dp_shard=1).preflight(clip, 2)
    cls = MMTEModule({"image": img}, {"preset": "tiny", "num_layers": 4}, {"d": {"name": "classification", "num_classes": 3}}, freeze="none")
    with pytest.raises(ValueError, match=r"mmte predict does not run under pipeline parallel \(pp=2\); checkpoints are portable"):
        MMTEStrategy(pp=2, dp_shard=1).preflight(cls, 2, "predict")
    with pytest.raises(ValueError, match=r"pp=2 with plain DDP \(dp_replicate=2\) is not supported"):
        MMTEStrategy(pp=2, dp_replicate=2, dp_shard=1).preflight(cls, 4)
    mixed = MMTEModule({"image": img}, {"preset": "tiny", "num_layers": 4}, {"d": {"name": "classification", "num_classes": 3}}, mixup=0.4)
    with pytest.raises(ValueError, match=r"^model.mixup 0.4 is not applied under pipeline parallel \(pp=2\)"):
        MMTEStrategy(pp=2, dp_shard=1).preflight(mixed, 2)
    assert MMTEStrategy(tp=2).preflight(mixed, 2).tp == 2  # tensor parallel blends the whole batch: allowed
