"""The composition matrix: every ``configs/parallel`` fragment x {fp32, every ``configs/precision/fp8-*``
fragment} x {no adapter, LoRA}, run through the real ``mmte fit`` (the CLI class, in-process under
``torchrun``) on the shipped recipes and ``MMTEModule`` / ``MetaTransformer``; never a toy module.

* Equivalence: the quickstart (frozen pretrained MiniLM) and the ETTh1 forecaster (trainable 4-layer
  backbone, channel-independent patches, RevIN) train 10 steps under every fragment and their per-step
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

The helper that runs a list of ``mmte fit`` argument lists in one launch is ``tests/parallel/cli_fit.py``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[2]
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


def launch(world: int, runs: dict[str, list[str]], tmp: Path, timeout: int) -> dict:
    """Run ``cli_fit.py`` over ``runs`` in one launch of ``world`` processes; its JSON results.

    A launch in which a process died of a native abort (no Python error recorded by any run) is started
    once more from clean run folders, with a warning holding the dead process's stacks: such an abort was
    seen twice in CI under load (in the gloo/C++ layer, between or after runs) and never reproduced alone.
    A second abort, or any Python error, fails the test.
    """
    tmp.mkdir(parents=True, exist_ok=True)
    spec, out = tmp / f"runs{world}.json", tmp / f"out{world}.json"
    spec.write_text(json.dumps(runs))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    script = str(REPO / "tests" / "parallel" / "cli_fit.py")
    if world == 1:
        cmd = [sys.executable, script, str(out), str(spec)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world), "--master_port", str(29500 + os.getpid() % 1000 + world),
               script, str(out), str(spec)]
    for attempt in (1, 2):
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        errors = {k: v for f in tmp.glob(f"out{world}.json.error-*") for k, v in json.loads(f.read_text()).items()}
        if attempt == 1 and proc.returncode != 0 and not errors and _native_abort(proc):
            warnings.warn(f"launch of {world} process(es) over {sorted(runs)} died of a native abort; started again:\n"
                          f"{proc.stderr[-4000:]}", stacklevel=2)
            out.unlink(missing_ok=True)
            for args in runs.values():
                if "--trainer.default_root_dir" in args:
                    shutil.rmtree(args[args.index("--trainer.default_root_dir") + 1], ignore_errors=True)
            continue
        break
    assert proc.returncode == 0 and out.exists() and not errors, f"{errors}\n{proc.stderr[-6000:]}"
    return json.loads(out.read_text())


def _native_abort(proc: subprocess.CompletedProcess) -> bool:
    """Whether a launch ended because a process was killed by SIGABRT or SIGSEGV (torchrun reports the
    rank's exit code as -6 / -11; one process ends with the negative code itself)."""
    if proc.returncode in (-6, -11):
        return True
    return any(f"exitcode  : {code} " in proc.stderr or f"(exitcode: {code})" in proc.stderr for code in (-6, -11))


def _worst_gap(losses: list[float], want: list[float]) -> float:
    """The largest per-step loss difference, relative to the loss (absolute below 1)."""
    return max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(losses, want))


def _ok(result: dict, name: str) -> dict:
    assert "error" not in result, (name, result.get("error"))
    assert "last.ckpt" in result["checkpoints"], (name, result["checkpoints"])
    assert result["losses"] and all(math.isfinite(x) for x in result["losses"]), (name, result["losses"])
    return result


# -------------------------------------------------------------------------------------------- equivalence
def _recipe_args(recipe: str, tmp: Path, name: str, dp: int) -> list[str]:
    args = ["--config", str(REPO / "recipes" / f"{recipe}.yaml"), "--precision", "32-true",
            "--trainer.max_steps", "10", "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false", "--trainer.log_every_n_steps", "1",
            "--trainer.default_root_dir", str(tmp / name)]
    if recipe == "quickstart":
        args += ["--data.init_args.batch_size", str(64 // dp)]
    else:  # etth1_forecast: 4 layers so a V-shaped pipeline has a layer per stage; no dropout (ranks draw differently)
        args += ["--data.init_args.path", str(ETT), "--data.init_args.batch_size", str(64 // dp),
                 "--model.backbone", "{preset: tiny, num_layers: 4}", "--model.heads.forecast.dropout", "0.0"]
    return args


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("recipe", ["quickstart", "etth1_forecast"])
def test_every_parallel_fragment_trains_like_one_process(recipe, tmp_path):
    if recipe == "etth1_forecast":
        from tests.conftest import need_data

        need_data(ETT, "ETTh1")
    ref = _ok(launch(1, {"one": _recipe_args(recipe, tmp_path, "one", 1)}, tmp_path, 600)["one"], "one")
    assert len(ref["losses"]) == 10
    by_world: dict[int, dict[str, list[str]]] = {}
    for frag, fragment_file in PARALLEL.items():
        args = _recipe_args(recipe, tmp_path, frag, _dp(frag)) + ["--config", str(fragment_file)]
        by_world.setdefault(_world(frag), {})[frag] = args
    for world, runs in sorted(by_world.items()):
        got = launch(world, runs, tmp_path, 1200)
        for frag in runs:
            r = _ok(got[frag], frag)
            assert len(r["losses"]) == 10, (frag, r["losses"])
            # fp32 sums in another order (TP splits the GEMM reductions): 1e-4 relative to the loss
            worst = _worst_gap(r["losses"], ref["losses"])
            assert worst <= 1e-4, (frag, worst, r["losses"], ref["losses"])
            assert sorted(r["trainable_abs_sums"]) == sorted(ref["trainable_abs_sums"]), frag  # freeze policy held
            for k, v in ref["trainable_abs_sums"].items():  # the trained weights themselves
                assert r["trainable_abs_sums"][k] == pytest.approx(v, rel=1e-3, abs=1e-3), (frag, k)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mixup_under_tensor_parallel_trains_like_one_process(tmp_path):
    """``model.mixup`` on the quickstart under tp2, with the two ranks' RNG streams pushed apart before every
    step: the first rank's blend weight and shuffle are broadcast to its tensor-parallel peer, so the
    per-step losses equal one process's within 1e-4 relative. Without the broadcast the peers blend
    different items and the shards' partial sums mix two batches."""
    mix = ["--model.mixup", "0.4"]
    ref = _ok(launch(1, {"one": _recipe_args("quickstart", tmp_path, "one", 1) + mix}, tmp_path, 600)["one"], "one")
    tp = _recipe_args("quickstart", tmp_path, "tp2", 1) + mix + ["--config", str(PARALLEL["tp2"]), "--desync_rng", "true"]
    r = _ok(launch(2, {"tp2": tp}, tmp_path, 900)["tp2"], "tp2")
    assert len(r["losses"]) == len(ref["losses"]) == 10
    worst = _worst_gap(r["losses"], ref["losses"])
    assert worst <= 1e-4, (worst, r["losses"], ref["losses"])


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_speaker_recipe_with_its_pretrained_speech_stem_trains_under_ddp_and_fsdp_like_one_process(tmp_path):
    """The speaker recipe as shipped (the fixed speech-embedding stem's buffers in the tokenizer, the frozen
    pretrained MiniLM trunk with LoRA) under ddp and fsdp: the per-step losses equal one process's, and the
    trained weights agree. Augmentation off and the centre crop, so that the same clips give the same inputs
    whichever rank reads them. At the recipe's lr (1e-3, Adam) the fp32 reduction-order difference grows
    about 6x a step (measured 2e-7, 1e-6, 8e-6, 5e-5, 1.3e-4 on steps 2-6 under ddp): the first three steps
    must agree within 1e-5 (the same data and weights), six steps within 1e-3."""
    from tests.conftest import need_data

    data = str(need_data(REPO.parent / "shared" / "data" / "fsdd" / "recordings", "FSDD recordings"))

    def args(name: str, dp: int) -> list[str]:
        return ["--config", str(REPO / "recipes" / "fsdd_speakers.yaml"), "--precision", "32-true", "--data.init_args.data_dir", data,
                "--data.init_args.augment", "null", "--data.init_args.crop", "center", "--data.init_args.batch_size", str(32 // dp),
                "--trainer.max_steps", "6", "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false",
                "--trainer.enable_model_summary", "false", "--trainer.log_every_n_steps", "1", "--trainer.default_root_dir", str(tmp_path / name)]

    ref = _ok(launch(1, {"one": args("one", 1)}, tmp_path, 600)["one"], "one")
    got = launch(2, {f: args(f, _dp(f)) + ["--config", str(PARALLEL[f])] for f in ("ddp", "fsdp")}, tmp_path, 900)
    for frag, r in got.items():
        r = _ok(r, frag)
        assert len(r["losses"]) == len(ref["losses"]) == 6
        first, worst = _worst_gap(r["losses"][:3], ref["losses"][:3]), _worst_gap(r["losses"], ref["losses"])
        assert first <= 1e-5 and worst <= 1e-3, (frag, first, worst, r["losses"], ref["losses"])
        assert any(".lora." in k for k in r["trainable_abs_sums"]) and not any(".stem." in k for k in r["trainable_abs_sums"])
        for k, v in ref["trainable_abs_sums"].items():
            assert r["trainable_abs_sums"][k] == pytest.approx(v, rel=1e-3, abs=1e-3), (frag, k)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_weight_average_under_sharding_and_pipeline_matches_one_process(tmp_path):
    """``model.ema_decay`` on the ETTh1 recipe under fsdp, tp2 and pp2-1f1b, validating every 2 steps (the
    averaged weights are swapped in and out 5 times): each rank averages its own shards or stage; the
    per-step losses equal one process's within 1e-5 (so training never runs on averaged weights left behind
    by a validation, e.g. in FSDP's gathered copy of a unit kept unsharded after forward: that gave 4e-5 on
    the third step), and the checkpoint holds the same averaged and live weights as one process's, within
    1e-4 (fp32 reduction order), with 10 updates counted. fsdp also writes a distributed (DCP) checkpoint
    folder: consolidated, it holds the same."""
    from mmte.training.portable import consolidate
    from tests.conftest import need_data

    need_data(ETT, "ETTh1")
    ema = ["--model.ema_decay", "0.9", "--trainer.limit_train_batches", "4", "--trainer.max_steps", "10"]
    ref_run = _ok(launch(1, {"one": _recipe_args("etth1_forecast", tmp_path, "one", 1) + ema}, tmp_path, 600)["one"], "one")
    runs = {f: _recipe_args("etth1_forecast", tmp_path, f, _dp(f)) + ema + ["--config", str(PARALLEL[f])] for f in ("fsdp", "tp2", "pp2-1f1b")}
    runs["fsdp-dcp"] = (_recipe_args("etth1_forecast", tmp_path, "fsdp-dcp", _dp("fsdp")) + ema
                        + ["--config", str(PARALLEL["fsdp"]), "--trainer.strategy.init_args.save_distributed_checkpoint", "true"])
    got = launch(2, runs, tmp_path, 1200)
    ref = torch.load(tmp_path / "one" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ref["mmte"]["ema"] == {"decay": 0.9, "updates": 10}
    head = "model.heads.forecast.proj.weight"
    assert (ref["state_dict"][head] - ref["current_model_state"][head]).abs().max() > 1e-4  # averaged != live
    for f in runs:
        r = _ok(got[f], f)
        assert len(r["losses"]) == len(ref_run["losses"]) == 10, (f, r["losses"])
        worst = _worst_gap(r["losses"], ref_run["losses"])
        assert worst <= 1e-5, (f, worst, r["losses"], ref_run["losses"])
        last = tmp_path / f / "checkpoints" / "last.ckpt"
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


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_other_pipeline_schedules_and_joint_fusion_train_like_one_process(tmp_path):
    """The schedules the shipped fragments do not name (interleaved 1F1B, DualPipeV) on the ETTh1 recipe,
    and joint fusion (audio + image tokens concatenated, tokenizers on stage 0) under 1F1B: per-step
    losses equal one process's within 1e-4 relative."""
    if not ETT.is_file():
        pytest.skip(f"ETTh1 not found at {ETT}")
    refs = launch(1, {"ett": _recipe_args("etth1_forecast", tmp_path, "one-ett", 1), "joint": _joint_args(tmp_path, "one-joint")}, tmp_path, 900)
    pp = ["--config", str(PARALLEL["pp2-1f1b"])]
    runs = {
        "interleaved": _recipe_args("etth1_forecast", tmp_path, "interleaved", 1) + pp
        + ["--trainer.strategy.init_args.pp_schedule", "interleaved_1f1b", "--trainer.strategy.init_args.microbatches", "4"],
        "dualpipev": _recipe_args("etth1_forecast", tmp_path, "dualpipev", 1) + ["--config", str(PARALLEL["pp2-zbv"])]
        + ["--trainer.strategy.init_args.pp_schedule", "dualpipev"],
        "joint": _joint_args(tmp_path, "joint") + pp,
    }
    got = launch(2, runs, tmp_path, 1200)
    for name, ref in (("interleaved", "ett"), ("dualpipev", "ett"), ("joint", "joint")):
        r, want = _ok(got[name], name), _ok(refs[ref], ref)["losses"]
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


@pytest.fixture(scope="module")
def matrix_refs(tmp_path_factory):
    """One process's run of every precision x adapter combination (the matrix's references)."""
    tmp = tmp_path_factory.mktemp("matrix")
    refs = {f"{p}-{a}": _matrix_args(tmp, f"one-{p}-{a}", p, a, 1) for p in PRECISIONS for a in ADAPTERS}
    return launch(1, refs, tmp, 900)


@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("world", sorted({_world(f) for f in PARALLEL}))
def test_fragment_precision_adapter_matrix(world, matrix_refs, tmp_path):
    runs: dict[str, list[str]] = {}
    combo: dict[str, tuple[str, str]] = {}  # run name -> (its fragment, its single-process reference)
    for frag in (f for f in PARALLEL if _world(f) == world):
        for p in PRECISIONS:
            for a in ADAPTERS:
                name = f"{frag}-{p}-{a}"
                combo[name] = (frag, f"{p}-{a}")
                runs[name] = _matrix_args(tmp_path, name, p, a, _dp(frag)) + ["--config", str(PARALLEL[frag])]
    got = launch(world, runs, tmp_path, 2000)
    failures = []
    for name, r in got.items():
        frag, key = combo[name]
        try:
            ref = _ok(matrix_refs[key], f"one-{key}")
            _ok(r, name)
            assert sorted(r["trainable_abs_sums"]) == sorted(ref["trainable_abs_sums"]), "trainable parameters differ from one process"
            tol = 1e-4 if key.startswith("fp32") else 2e-3
            if key.startswith(("fp8-block", "fp8-mx")) and _dims(frag).tp > 1:  # per-shard tiles: another grid
                fp32 = _ok(matrix_refs[f"fp32-{key.rsplit('-', 1)[1]}"], "fp32")["losses"][0]
                tol = max(tol, abs(ref["losses"][0] - fp32))
            assert abs(r["losses"][0] - ref["losses"][0]) <= tol, ("first loss", r["losses"][0], ref["losses"][0])
            if key.endswith("lora"):
                _check_lora(tmp_path / name, name)
        except AssertionError as e:
            failures.append(f"{name}: {e}")
    assert sorted(got) == sorted(runs)
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


def test_readme_table_matches_the_matrix():
    """The README's "what composes with what" table lists exactly the fragments, precisions and adapters
    that ``test_fragment_precision_adapter_matrix`` trains (every cell of which must pass there)."""
    text = (REPO / "README.md").read_text()
    start = text.index("<!-- composition-table")
    lines = [ln for ln in text[start:].splitlines()[1:] if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[2:] == [*PRECISIONS, "+ LoRA"], header
    rows = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        rows[cells[0].split("`")[1]] = cells[1:]
    assert sorted(rows) == sorted(PARALLEL)
    for frag, cells in rows.items():
        assert int(cells[0]) == _world(frag), frag
        assert all(c == "yes" for c in cells[1:]), (frag, cells)
