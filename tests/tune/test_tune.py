"""mmte tune: the search space, the command's checks, and a study through the CLI (trials as mmte fit,
pruning, resume after a kill, best.yaml re-fitted, the test split never read)."""

from __future__ import annotations

import csv
import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytest.importorskip("optuna")
pytest.importorskip("optuna_integration")

from mmte.cli import main
from mmte.cli.tune import split_argv
from mmte.errors import UsageError
from mmte.tune.space import cli_value, parse_space
from mmte.tune.trial import fit_command, last_error_line

ROOT = Path(__file__).resolve().parents[2]
RECIPE = str(ROOT / "recipes" / "quickstart.yaml")


# ------------------------------------------------------------------------------------------- space
def test_space_forms_become_optuna_distributions():
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    s = parse_space({"model.lr": {"log": [1e-4, 1e-2]}, "model.heads.digit.dropout": [0.0, 0.5], "trainer.max_epochs": {"int": [2, 8]},
                     "model.freeze": {"choice": ["backbone", "none"]}, "model.weight_decay": {"float": [0.0, 0.1], "step": 0.05}})
    assert s["model.lr"] == FloatDistribution(1e-4, 1e-2, log=True)
    assert s["model.heads.digit.dropout"] == FloatDistribution(0.0, 0.5)
    assert s["trainer.max_epochs"] == IntDistribution(2, 8)
    assert s["model.freeze"] == CategoricalDistribution(["backbone", "none"])
    assert s["model.weight_decay"] == FloatDistribution(0.0, 0.1, step=0.05)


@pytest.mark.parametrize("doc, message", [
    ({"model.lr": [1e-2, 1e-4]}, "model.lr range [0.01, 0.0001] is empty"),
    ({"model.lr": {"log": [0.0, 1e-2]}}, "model.lr log range [0.0, 0.01] reaches 0.0"),
    ({"trainer.max_epochs": {"int": [1.5, 4]}}, "int range [1.5, 4] has a fraction"),
    ({"model.freeze": {"choice": []}}, "choice [] is empty"),
    ({"model.lr": {"uniform": [0, 1]}}, "expected exactly one of"),
    ({"model.lr": [0.1]}, "is not two numbers"),
    ([], "holds list"),
])
def test_impossible_space_entries_are_one_line(doc, message):
    with pytest.raises(UsageError) as e:
        parse_space(doc, "space.yaml")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_trial_command_carries_values_threads_and_the_pruning_callback():
    assert split_argv(["--config", "r.yaml", "--tune.trials", "3", "--tune.space=s.yaml", "--model.lr", "1"]) == (
        ["--tune.trials", "3", "--tune.space=s.yaml"], ["--config", "r.yaml", "--model.lr", "1"])
    cmd = fit_command(["--config", "r.yaml"], {"model.lr": 1e-3, "model.freeze": "none", "x.on": True}, "/t/3", 4, "val_acc", "sqlite:///s.db", "st", 3)
    assert cmd[1:8] == ["-m", "mmte", "fit", "--config", "r.yaml", "--model.lr", "0.001"]
    assert cmd[cmd.index("--threads") + 1] == "4" and cmd[cmd.index("--trainer.default_root_dir") + 1] == "/t/3"
    assert cmd[-1].startswith("--trainer.callbacks+=") and '"trial": 3' in cmd[-1] and "mmte.tune.callback.OptunaPruning" in cmd[-1]
    assert cli_value(True) == "true" and cli_value([1, 2]) == "[1, 2]" and cli_value(None) == "null"
    assert last_error_line("x\nmmte: error: bad value, expected y\n") == "bad value, expected y"


# ------------------------------------------------------------------------------------ resuming
GRID = {"model.lr": [3e-3, 1e-12, 1e-3]}


def _grid_study(path: Path):
    import optuna

    return optuna.create_study(storage=f"sqlite:///{path}", study_name="s", load_if_exists=True, direction="maximize",
                               sampler=optuna.samplers.GridSampler(GRID, seed=0))


def _grid_objective(trial) -> float:
    return {1e-3: 0.9, 1e-12: 0.1, 3e-3: 0.8}[trial.suggest_categorical("model.lr", GRID["model.lr"])]


@pytest.mark.parametrize("cut", ["between trials", "trial created", "grid point given", "values drawn", "stopped by a signal"])
def test_a_trial_cut_at_any_point_runs_its_values_again_and_the_grid_completes(tmp_path, cut):
    """Where a kill can leave the study: the next trial not created yet, created without values, given its grid
    point but no values yet, running with its values, or failed by a forwarded signal. Resumed (twice, the
    second finding nothing to do), every grid point is run exactly once to the end."""
    import optuna
    from optuna.trial import TrialState

    from mmte.tune.study import requeue_interrupted

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = _grid_study(tmp_path / "s.db")
    study.optimize(_grid_objective, n_trials=1)
    if cut == "trial created":
        study._storage.create_new_trial(study._study_id)
    elif cut == "grid point given":
        study.ask()
    elif cut in ("values drawn", "stopped by a signal"):
        t = study.ask()
        t.suggest_categorical("model.lr", GRID["model.lr"])
        if cut == "stopped by a signal":
            study.tell(t, state=TrialState.FAIL)
    for _ in range(2):
        study = _grid_study(tmp_path / "s.db")
        done = requeue_interrupted(study)
        study.optimize(_grid_objective, n_trials=max(0, 3 - done))
    finished = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    assert sorted(t.params["model.lr"] for t in finished) == [1e-12, 1e-3, 3e-3], [(t.number, t.state, t.params) for t in study.get_trials()]
    assert all(t.state in (TrialState.COMPLETE, TrialState.FAIL) for t in study.get_trials())


# -------------------------------------------------------------------------------- command checks
def _tune(tmp_path, *args: str) -> list[str]:
    return ["tune", "--config", RECIPE, "--tune.out", str(tmp_path / "out"), *args]


@pytest.mark.parametrize("space, flags, message", [
    ("model.lr: {log: [-1, 1]}\n", [], "model.lr log range [-1, 1] reaches -1"),
    ("model.lr: [1, 2]\n", ["--tune.metric", "test_acc"], "--tune.metric test_acc is not a validation metric"),
    ("model.lr: [1, 2]\n", ["--tune.trials", "0"], "--tune.trials is 0, expected an int >= 1"),
    ("model.lr: [1, 2]\n", ["--tune.sampler", "grid"], "--tune.sampler grid: model.lr is a range"),
    ("model.lr: [1, 2]\n", ["--tune.triles", "3"], "unknown option '--tune.triles'"),
])
def test_bad_tune_input_is_one_error_line_before_any_trial(tmp_path, capsys, monkeypatch, space, flags, message):
    monkeypatch.setattr("mmte.tune.study.preflight", lambda opts: pytest.fail("the pre-flight mmte validate run started"))
    (tmp_path / "space.yaml").write_text(space)
    args = _tune(tmp_path, "--tune.space", str(tmp_path / "space.yaml"), *(["--tune.trials", "2"] if "--tune.trials" not in flags else []), *flags)
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("mmte: error: ") and message in err[-1], err
    assert not (tmp_path / "out" / "trials").exists()


def test_the_overview_names_every_command(capsys):
    from mmte.cli import COMMANDS, LIGHTNING_COMMANDS

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    usage = out.splitlines()[0]
    listed = {line.split()[0] for line in out.split("commands:", 1)[1].splitlines() if line.startswith("  ") and not line.startswith("   ")}
    for verb in (*LIGHTNING_COMMANDS, *COMMANDS):
        assert verb in usage and verb in listed, verb


def _run(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "mmte", *args], check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.parametrize("space, flags, message", [
    ("model.lrr: [0.001, 0.01]\n", [], "--tune.space model.lrr"),
    ("model.lr: [0.001, 0.01]\n", ["--tune.metric", "val_mse"], "--tune.metric val_mse is not logged by this recipe, expected one of val_acc"),
])
def test_unknown_key_or_unlogged_metric_fail_in_the_preflight(tmp_path, capsys, monkeypatch, space, flags, message):
    """``mmte tune`` here (its ``main``), its pre-flight ``mmte validate`` a real process, as users run it."""
    (tmp_path / "space.yaml").write_text(space)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    assert main([*_tune(tmp_path, "--tune.space", "space.yaml", "--tune.trials", "2", *flags), *SMALL]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("mmte: error: ") and message in err[-1], err[-20:]
    assert not (tmp_path / "out" / "trials").exists()


# ---------------------------------------------------------------------------------- a real study
SMALL = ["--trainer.max_epochs", "2", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2", "--trainer.enable_progress_bar", "false",
         "--data.class_path", "tests.tune.guarded_data.NoTestSplitArrays", "--data.init_args.test_fraction", "0.2"]
# grid order at seed 0: 1e-3 first (finishes), then the learning rate that learns nothing (pruned at its first validation)
SPACE = "model.lr: {choice: [3.0e-3, 1.0e-12, 1.0e-3]}\n"


def _study(out: Path):
    import optuna

    return optuna.load_study(study_name="mmte-tune", storage=f"sqlite:///{out / 'study.db'}")


@pytest.mark.slow
def test_tune_through_the_cli_prunes_resumes_and_writes_a_reproducible_recipe(tmp_path):
    from optuna.trial import TrialState

    (tmp_path / "space.yaml").write_text(SPACE)
    out = tmp_path / "out"
    args = [*_tune(tmp_path, "--tune.space", "space.yaml", "--tune.trials", "3", "--tune.metric", "val_acc", "--tune.sampler", "grid",
                   "--tune.startup_trials", "1"), *SMALL]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # first run: killed (the whole process group) once the first trial finished
    proc = subprocess.Popen([sys.executable, "-m", "mmte", *args], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None:
        time.sleep(1)
        # the trials folder appears once the study exists: opening study.db before that races the tune process
        # creating its schema (seen once in CI: a UNIQUE constraint error from the storage's version table)
        if (out / "trials").is_dir() and any(t.state == TrialState.COMPLETE for t in _study(out).get_trials(deepcopy=False)):
            break
    assert proc.poll() is None, proc.stderr.read()[-2000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = [t for t in _study(out).get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    assert len(first) == 1
    stamp = os.path.getmtime(out / "trials" / str(first[0].number) / "fit.log")

    # resumed (no second pre-flight): the finished trial is kept, the interrupted one runs again with its values, the grid is completed
    r = _run(args, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "pre-flight run passed for this study's command and recipe files before" in r.stderr, r.stderr[-3000:]
    trials = _study(out).get_trials(deepcopy=False)
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert sorted(t.params["model.lr"] for t in finished) == [1e-12, 1e-3, 3e-3], [(t.number, t.state, t.params) for t in trials]
    assert os.path.getmtime(out / "trials" / str(first[0].number) / "fit.log") == stamp
    assert sum(t.params == first[0].params for t in finished) == 1
    assert all(t.state == TrialState.FAIL for t in trials if t not in finished)

    # the learning rate that learns nothing is pruned at its first of two validations
    pruned = [t for t in finished if t.state == TrialState.PRUNED]
    assert [t.params["model.lr"] for t in pruned] == [1e-12] and list(pruned[0].intermediate_values) == [0]
    metrics = glob.glob(str(out / "trials" / str(pruned[0].number) / "logs" / "*" / "metrics.csv"))
    assert max(int(row["epoch"]) for row in csv.DictReader(Path(metrics[0]).read_text().splitlines()) if row.get("val_acc")) == 0

    # outputs; the test split was never built (the data module raises if it is)
    assert (out / "trials.csv").exists() and (out / "optimization_history.html").exists() and (out / "optimization_history.png").exists()
    rows = list(csv.DictReader((out / "trials.csv").read_text().splitlines()))
    assert {row["state"] for row in rows} >= {"COMPLETE", "PRUNED"}
    logs = "".join(Path(p).read_text() for p in glob.glob(str(out / "trials" / "*" / "fit.log")))
    assert "the test split was read" not in logs
    best = yaml.safe_load((out / "best.yaml").read_text())
    study = _study(out)
    assert best["model"]["lr"] == study.best_trial.params["model.lr"]
    assert not any("OptunaPruning" in str(c) for c in best["trainer"].get("callbacks") or [])

    # best.yaml re-fitted with the same seed (and the trial's threads) gives the best trial's validation metric
    threads = yaml.safe_load(Path(glob.glob(os.path.join(study.best_trial.user_attrs["folder"], "logs", "*", "config.yaml"))[0]).read_text())["threads"]
    again = _run(["fit", "--config", str(out / "best.yaml"), "--trainer.default_root_dir", str(tmp_path / "again"), "--checkpoint.dirpath",
                  str(tmp_path / "again" / "ck"), "--threads", str(threads)], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    rows = list(csv.DictReader(Path(glob.glob(str(tmp_path / "again" / "logs" / "*" / "metrics.csv"))[0]).read_text().splitlines()))
    assert max(float(row["val_acc"]) for row in rows if row.get("val_acc")) == pytest.approx(study.best_value, abs=1e-6)
