"""The composition matrix: every ``configs/parallel`` fragment x {fp32, every ``configs/precision/fp8-*``
fragment} x {no adapter, LoRA}, run through the real ``mmte fit`` (the CLI class, in-process under
``torchrun``) on the shipped recipes and ``MMTEModule`` / ``MetaTransformer``; never a toy module.

* Equivalence: the quickstart (frozen pretrained MiniLM) and the ETTh1 forecaster (trainable 4-layer
  backbone, channel-independent patches, RevIN) train 6 steps under every fragment and their per-step
  losses equal one process's within 1e-4 (fp32, same global batch: data-parallel runs take batch/dp per
  rank), with the same trainable parameters.
* Matrix: fragment x precision x adapter, 2 steps each on the quickstart with a tiny 4-layer backbone:
  every combination trains, writes a checkpoint, keeps frozen what the freeze policy froze, trains the
  LoRA adapters (they are in the checkpoint and moved), and its first loss is one process's (fp32 1e-4;
  FP8: 2e-3, as scales are reduced over the data-parallel group the quantisation grid is the same; block
  and MX scaling under tensor parallelism tile each rank's shard of the contraction dimension, another
  grid than one process's, so there the bound is the larger of 2e-3 and one process's own FP8 error on
  that loss, |fp8 - fp32|: measured 2.7e-3 against an FP8 error of 5.1e-3 for fp8-block on tp2).
* Refusals: combinations that cannot work fail before any process starts, with the reason asserted.

Every multi-process test of this file names its runs in :data:`PLANS`; the module fixture ``runs`` starts
ONE launch per world size (1, 2, 4) over the runs of the tests pytest selected, so the file pays three
start-ups (imports, process group) rather than one or more per test. The helper that runs a list of
``mmte fit`` argument lists in one launch is ``tests/parallel/cli_fit.py``, started by ``_launch.launch``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml

from ._launch import REPO, launch_partial

PARALLEL = {p.stem: p for p in sorted((REPO / "configs" / "parallel").glob("*.yaml"))}
FP8 = {p.stem: p for p in sorted((REPO / "configs" / "precision").glob("fp8-*.yaml"))}
PRECISIONS = ["fp32", *FP8]
ADAPTERS = ["none", "lora"]
ETT = REPO.parent / "shared" / "data" / "ett" / "ETTh1.csv"


def _world(fragment: str) -> int:
    return int(yaml.safe_load(PARALLEL[fragment].read_text())["trainer"]["devices"])


def _dims(fragment: str):
    """The fragment's parallel dimensions, resolved for its world size (``.dp``, ``.tp``, ``.pp``...)."""
    from mmte.training.strategy import MMTEStrategy

    s = MMTEStrategy(**yaml.safe_load(PARALLEL[fragment].read_text())["trainer"]["strategy"]["init_args"])
    return s.dims.resolve(_world(fragment))


def _dp(fragment: str) -> int:
    return _dims(fragment).dp


def _worst_gap(losses: list[float], want: list[float]) -> float:
    """The largest per-step loss difference, relative to the loss (absolute below 1)."""
    return max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(losses, want))


def _ok(result: dict, name: str) -> dict:
    assert "error" not in result, (name, result.get("error"))
    assert "last.ckpt" in result["checkpoints"], (name, result["checkpoints"])
    assert result["losses"] and all(math.isfinite(x) for x in result["losses"]), (name, result["losses"])
    return result


# ------------------------------------------------------------------------------------ one launch per world
#: the runs of each multi-process test: ``plan(tmp, **its parameters) -> {world size: {run name: args}}``
#: (run names are unique across the file; each run writes under ``tmp / name``)
PLANS: dict[str, Callable[..., dict[int, dict[str, list[str]]]]] = {}
FSDD = REPO.parent / "shared" / "data" / "fsdd" / "recordings"
STEPS = 6  # the equivalence runs: every fragment's per-step losses against one process's


def plan(test: str):
    def register(fn):
        PLANS[test] = fn
        return fn
    return register


@dataclass
class Runs:
    """The results of the file's launches: ``tmp`` (the run folders' parent), ``results[name]``, and why a
    launch failed (by world size; empty when it did not)."""

    tmp: Path
    results: dict[str, dict]
    failures: dict[int, str]
    world_of: dict[str, int]

    def __getitem__(self, name: str) -> dict:
        """The run's result, checked (:func:`_ok`); a run its launch never reached fails with the launch's reason."""
        assert name in self.results, (name, self.failures.get(self.world_of.get(name, 0), "not planned"))
        return _ok(self.results[name], name)


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory) -> Runs:
    """One launch per world size over the planned runs of every selected test of this file."""
    tmp = tmp_path_factory.mktemp("composition")
    here = Path(request.module.__file__)
    by_world: dict[int, dict[str, list[str]]] = {}
    for item in request.session.items:
        fn = PLANS.get(getattr(item, "originalname", ""))
        if fn is None or Path(item.path) != here:
            continue
        params = item.callspec.params if hasattr(item, "callspec") else {}
        for world, named in fn(tmp, **params).items():
            by_world.setdefault(world, {}).update(named)
    results, failures, world_of = {}, {}, {}
    for world, named in sorted(by_world.items()):
        got, failure = launch_partial(world, named, tmp / f"launch{world}", 900 + 60 * len(named))
        results.update(got)
        world_of.update(dict.fromkeys(named, world))
        if failure:
            failures[world] = failure
    return Runs(tmp, results, failures, world_of)


# -------------------------------------------------------------------------------------------- equivalence
def _recipe_args(recipe: str, tmp: Path, name: str, dp: int) -> list[str]:
    args = ["--config", str(REPO / "recipes" / f"{recipe}.yaml"), "--precision", "32-true",
            "--trainer.max_steps", str(STEPS), "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false", "--trainer.log_every_n_steps", "1",
            "--trainer.default_root_dir", str(tmp / name)]
    if recipe == "quickstart":
        args += ["--data.init_args.batch_size", str(64 // dp)]
    else:  # etth1_forecast: 4 layers so a V-shaped pipeline has a layer per stage; no dropout (ranks draw differently)
        args += ["--data.init_args.path", str(ETT), "--data.init_args.batch_size", str(64 // dp),
                 "--model.backbone", "{preset: tiny, num_layers: 4}", "--model.heads.forecast.dropout", "0.0"]
    return args


@plan("test_every_parallel_fragment_trains_like_one_process")
def _plan_every_fragment(tmp: Path, recipe: str) -> dict[int, dict[str, list[str]]]:
    if recipe == "etth1_forecast" and not ETT.is_file():
        return {}
    out = {1: {f"eq-{recipe}-one": _recipe_args(recipe, tmp, f"eq-{recipe}-one", 1)}}
    for frag, fragment_file in PARALLEL.items():
        name = f"eq-{recipe}-{frag}"
        out.setdefault(_world(frag), {})[name] = _recipe_args(recipe, tmp, name, _dp(frag)) + ["--config", str(fragment_file)]
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
        worst = _worst_gap(r["losses"], ref["losses"])
        assert worst <= 1e-4, (frag, worst, r["losses"], ref["losses"])
        assert sorted(r["trainable_abs_sums"]) == sorted(ref["trainable_abs_sums"]), frag  # freeze policy held
        for k, v in ref["trainable_abs_sums"].items():  # the trained weights themselves
            assert r["trainable_abs_sums"][k] == pytest.approx(v, rel=1e-3, abs=1e-3), (frag, k)


@plan("test_mixup_under_tensor_parallel_trains_like_one_process")
def _plan_mixup(tmp: Path) -> dict[int, dict[str, list[str]]]:
    mix = ["--model.mixup", "0.4"]
    return {1: {"mixup-one": _recipe_args("quickstart", tmp, "mixup-one", 1) + mix},
            2: {"mixup-tp2": _recipe_args("quickstart", tmp, "mixup-tp2", 1) + mix + ["--config", str(PARALLEL["tp2"]), "--desync_rng", "true"]}}


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_mixup_under_tensor_parallel_trains_like_one_process(runs):
    """``model.mixup`` on the quickstart under tp2, with the two ranks' RNG streams pushed apart before every
    step: the first rank's blend weight and shuffle are broadcast to its tensor-parallel peer, so the
    per-step losses equal one process's within 1e-4 relative. Without the broadcast the peers blend
    different items and the shards' partial sums mix two batches."""
    ref, r = runs["mixup-one"], runs["mixup-tp2"]
    assert len(r["losses"]) == len(ref["losses"]) == STEPS
    worst = _worst_gap(r["losses"], ref["losses"])
    assert worst <= 1e-4, (worst, r["losses"], ref["losses"])


def _speaker_args(tmp: Path, name: str, dp: int) -> list[str]:
    return ["--config", str(REPO / "recipes" / "fsdd_speakers.yaml"), "--precision", "32-true", "--data.init_args.data_dir", str(FSDD),
            "--data.init_args.augment", "null", "--data.init_args.crop", "center", "--data.init_args.batch_size", str(32 // dp),
            "--trainer.max_steps", "6", "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false", "--trainer.log_every_n_steps", "1", "--trainer.default_root_dir", str(tmp / name)]


@plan("test_speaker_recipe_with_its_pretrained_speech_stem_trains_under_ddp_and_fsdp_like_one_process")
def _plan_speaker(tmp: Path) -> dict[int, dict[str, list[str]]]:
    if not FSDD.is_dir():
        return {}
    return {1: {"speaker-one": _speaker_args(tmp, "speaker-one", 1)},
            2: {f"speaker-{f}": _speaker_args(tmp, f"speaker-{f}", _dp(f)) + ["--config", str(PARALLEL[f])] for f in ("ddp", "fsdp")}}


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_speaker_recipe_with_its_pretrained_speech_stem_trains_under_ddp_and_fsdp_like_one_process(runs):
    """The speaker recipe as shipped (the fixed speech-embedding stem's buffers in the tokenizer, the frozen
    pretrained MiniLM trunk with LoRA) under ddp and fsdp: the per-step losses equal one process's, and the
    trained weights agree. Augmentation off and the centre crop, so that the same clips give the same inputs
    whichever rank reads them. At the recipe's lr (1e-3, Adam) the fp32 reduction-order difference grows
    about 6x a step (measured 2e-7, 1e-6, 8e-6, 5e-5, 1.3e-4 on steps 2-6 under ddp): the first three steps
    must agree within 1e-5 (the same data and weights), six steps within 1e-3."""
    from tests.conftest import need_data

    need_data(FSDD, "FSDD recordings")
    ref = runs["speaker-one"]
    for frag in ("ddp", "fsdp"):
        r = runs[f"speaker-{frag}"]
        assert len(r["losses"]) == len(ref["losses"]) == 6
        first, worst = _worst_gap(r["losses"][:3], ref["losses"][:3]), _worst_gap(r["losses"], ref["losses"])
        assert first <= 1e-5 and worst <= 1e-3, (frag, first, worst, r["losses"], ref["losses"])
        assert any(".lora." in k for k in r["trainable_abs_sums"]) and not any(".stem." in k for k in r["trainable_abs_sums"])
        for k, v in ref["trainable_abs_sums"].items():
            assert r["trainable_abs_sums"][k] == pytest.approx(v, rel=1e-3, abs=1e-3), (frag, k)


EMA = ["--model.ema_decay", "0.9", "--trainer.limit_train_batches", "4", "--trainer.max_steps", str(STEPS)]


@plan("test_weight_average_under_sharding_and_pipeline_matches_one_process")
def _plan_weight_average(tmp: Path) -> dict[int, dict[str, list[str]]]:
    if not ETT.is_file():
        return {}
    two = {f"ema-{f}": _recipe_args("etth1_forecast", tmp, f"ema-{f}", _dp(f)) + EMA + ["--config", str(PARALLEL[f])]
           for f in ("fsdp", "tp2", "pp2-1f1b")}
    two["ema-fsdp-dcp"] = (_recipe_args("etth1_forecast", tmp, "ema-fsdp-dcp", _dp("fsdp")) + EMA
                           + ["--config", str(PARALLEL["fsdp"]), "--trainer.strategy.init_args.save_distributed_checkpoint", "true"])
    return {1: {"ema-one": _recipe_args("etth1_forecast", tmp, "ema-one", 1) + EMA}, 2: two}


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_weight_average_under_sharding_and_pipeline_matches_one_process(runs):
    """``model.ema_decay`` on the ETTh1 recipe under fsdp, tp2 and pp2-1f1b over 6 steps of 4-batch epochs,
    validating twice an epoch (the averaged weights are swapped in and out 3 times, across an epoch's end):
    each rank averages its own shards or stage; the per-step losses equal one process's within 1e-5 (so
    training never runs on averaged weights left behind by a validation, e.g. in FSDP's gathered copy of a
    unit kept unsharded after forward: that gave 4e-5 on the third step), and the checkpoint holds the same
    averaged and live weights as one process's, within 1e-4 (fp32 reduction order), with every update
    counted. fsdp also writes a distributed (DCP) checkpoint folder: consolidated, it holds the same."""
    from mmte.training.portable import consolidate
    from tests.conftest import need_data

    need_data(ETT, "ETTh1")
    ref_run = runs["ema-one"]
    ref = torch.load(runs.tmp / "ema-one" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ref["mmte"]["ema"] == {"decay": 0.9, "updates": STEPS}
    head = "model.heads.forecast.proj.weight"
    assert (ref["state_dict"][head] - ref["current_model_state"][head]).abs().max() > 1e-4  # averaged != live
    for f in ("fsdp", "tp2", "pp2-1f1b", "fsdp-dcp"):
        r = runs[f"ema-{f}"]
        assert len(r["losses"]) == len(ref_run["losses"]) == STEPS, (f, r["losses"])
        worst = _worst_gap(r["losses"], ref_run["losses"])
        assert worst <= 1e-5, (f, worst, r["losses"], ref_run["losses"])
        last = runs.tmp / f"ema-{f}" / "checkpoints" / "last.ckpt"
        assert last.is_dir() == (f == "fsdp-dcp"), f
        ck = consolidate(last) if last.is_dir() else torch.load(last, map_location="cpu", weights_only=False)
        assert ck["mmte"]["ema"] == ref["mmte"]["ema"], f
        for part in ("state_dict", "current_model_state"):
            assert set(ck[part]) == set(ref[part]), (f, part)
            for k, v in ref[part].items():
                torch.testing.assert_close(ck[part][k], v, rtol=1e-3, atol=1e-4, msg=f"{f} {part} {k}")


def _joint_args(tmp: Path, name: str) -> list[str]:
    """The audio+image joint-fusion recipe (two tokenizers concatenated into one sequence), tiny backbone."""
    return ["--config", str(REPO / "recipes" / "audio_image_joint.yaml"), "--precision", "32-true",
            "--model.backbone", "{preset: tiny, num_layers: 4}", "--trainer.max_steps", "3", "--trainer.limit_val_batches", "1",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", "--trainer.log_every_n_steps", "1",
            "--trainer.default_root_dir", str(tmp / name)]


@plan("test_other_pipeline_schedules_and_joint_fusion_train_like_one_process")
def _plan_schedules(tmp: Path) -> dict[int, dict[str, list[str]]]:
    pp = ["--config", str(PARALLEL["pp2-1f1b"])]
    one = {"sched-joint-one": _joint_args(tmp, "sched-joint-one")}
    two = {"sched-joint": _joint_args(tmp, "sched-joint") + pp}
    if ETT.is_file():
        one["sched-ett-one"] = _recipe_args("etth1_forecast", tmp, "sched-ett-one", 1)
        two["sched-interleaved"] = (_recipe_args("etth1_forecast", tmp, "sched-interleaved", 1) + pp
                                    + ["--trainer.strategy.init_args.pp_schedule", "interleaved_1f1b", "--trainer.strategy.init_args.microbatches", "4"])
        two["sched-dualpipev"] = (_recipe_args("etth1_forecast", tmp, "sched-dualpipev", 1) + ["--config", str(PARALLEL["pp2-zbv"])]
                                  + ["--trainer.strategy.init_args.pp_schedule", "dualpipev"])
    return {1: one, 2: two}


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_other_pipeline_schedules_and_joint_fusion_train_like_one_process(runs):
    """The schedules the shipped fragments do not name (interleaved 1F1B, DualPipeV) on the ETTh1 recipe,
    and joint fusion (audio + image tokens concatenated, tokenizers on stage 0) under 1F1B: per-step
    losses equal one process's within 1e-4 relative."""
    if not ETT.is_file():
        pytest.skip(f"ETTh1 not found at {ETT}")
    for name, ref in (("interleaved", "ett"), ("dualpipev", "ett"), ("joint", "joint")):
        r, want = runs[f"sched-{name}"], runs[f"sched-{ref}-one"]["losses"]
        assert len(r["losses"]) == len(want), (name, r["losses"])
        worst = _worst_gap(r["losses"], want)
        assert worst <= 1e-4, (name, worst, r["losses"], want)


# ------------------------------------------------------------------------------------------------- matrix
def _matrix_args(tmp: Path, name: str, precision: str, adapter: str, dp: int) -> list[str]:
    args = ["--config", str(REPO / "recipes" / "quickstart.yaml"), "--config", str(REPO / "configs" / "encoders" / "tiny.yaml"),
            "--model.backbone", "{preset: tiny, num_layers: 4}", "--precision", "32-true"]
    args += ["--config", str(REPO / "configs" / "models" / "lora.yaml")] if adapter == "lora" else ["--model.lora", "null"]
    if precision != "fp32":
        args += ["--config", str(FP8[precision])]
    return args + ["--trainer.max_steps", "2", "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false",
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
    cells = {f"matrix-{frag}-{p}-{a}": _matrix_args(tmp, f"matrix-{frag}-{p}-{a}", p, a, _dp(frag)) + ["--config", str(PARALLEL[frag])]
             for frag in PARALLEL if _world(frag) == world for p in PRECISIONS for a in ADAPTERS}
    return {1: one, world: cells}


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("world", sorted({_world(f) for f in PARALLEL}))
def test_fragment_precision_adapter_matrix(world, runs):
    failures = []
    cells = 0
    for frag in (f for f in PARALLEL if _world(f) == world):
        for p in PRECISIONS:
            for a in ADAPTERS:
                name, key = f"matrix-{frag}-{p}-{a}", f"{p}-{a}"
                cells += 1
                try:
                    ref, r = runs[f"matrix-one-{key}"], runs[name]
                    assert sorted(r["trainable_abs_sums"]) == sorted(ref["trainable_abs_sums"]), "trainable parameters differ from one process"
                    tol = 1e-4 if p == "fp32" else 2e-3
                    if p in ("fp8-block", "fp8-mx") and _dims(frag).tp > 1:  # per-shard tiles: another grid
                        tol = max(tol, abs(ref["losses"][0] - runs[f"matrix-one-fp32-{a}"]["losses"][0]))
                    assert abs(r["losses"][0] - ref["losses"][0]) <= tol, ("first loss", r["losses"][0], ref["losses"][0])
                    if a == "lora":
                        _check_lora(runs.tmp / name, name)
                except AssertionError as e:
                    failures.append(f"{name}: {e}")
    assert cells == len(PRECISIONS) * len(ADAPTERS) * sum(_world(f) == world for f in PARALLEL) > 0
    assert not failures, "\n".join(failures)


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
