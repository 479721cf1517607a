"""configs/loggers/*.yaml through mmte fit, each read back with the tracker's own client: hyper-parameters
(the model's options), the merged recipe (trainer, model and data sections after every --config and flag), the
best checkpoint's path and the validation metrics are where the tracker keeps them, and nothing needs a network."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--config", str(ROOT / "recipes" / "quickstart.yaml"), "--config", str(ROOT / "configs" / "data" / "smoke.yaml"),
         "--config", str(ROOT / "configs" / "encoders" / "tiny.yaml"), "--model.lr", "0.002"]


def _check_merged(tmp_path: Path, get) -> None:
    """``get(section, key)``: the tracker's stored value of the merged recipe's ``section.key`` (``("", key)``: a
    top-level key). The recipe says 6 epochs, smoke.yaml 1: the merged value is 1; the flags are there too."""
    assert int(get("trainer", "max_epochs")) == 1
    assert get("trainer", "default_root_dir") == str(tmp_path / "run")
    assert float(get("model", "lr")) == 0.002
    assert get("data", "class_path") == "mmte.training.data.ArrayDataModule"
    best = Path(get("", "best_checkpoint"))
    assert best.parent == tmp_path / "run" / "checkpoints" and best.is_file(), best


def _fit(tmp_path: Path, fragment: str, *flags: str, monkeypatch: pytest.MonkeyPatch | None = None) -> None:
    """``mmte fit`` with the logger fragment: in this process (its ``main``, as the console command calls it) when
    ``monkeypatch`` is given (the file-writing trackers), else in a fresh process (W&B, which starts its own
    service process and wraps the console)."""
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "MLFLOW_ALLOW_FILE_STORE": "true"}
    args = [*QUICK, "--config", str(ROOT / "configs" / "loggers" / f"{fragment}.yaml"), "--trainer.default_root_dir", str(tmp_path / "run"), *flags]
    if monkeypatch is not None:
        from mmte.cli import main

        monkeypatch.chdir(tmp_path)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        assert main(["fit", *args]) == 0
        return
    r = subprocess.run([sys.executable, "-m", "mmte", "fit", *args], check=False, cwd=tmp_path, env={**os.environ, **env}, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.slow
def test_tensorboard_fragment(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _fit(tmp_path, "tensorboard", "--trainer.logger.init_args.save_dir", str(tmp_path / "tb"), monkeypatch=monkeypatch)
    (version,) = glob.glob(str(tmp_path / "tb" / "mmte" / "version_*"))
    events = EventAccumulator(version)
    events.Reload()
    assert {"val_acc", "val_loss"} <= set(events.Tags()["scalars"])
    assert 0.0 <= events.Scalars("val_acc")[-1].value <= 1.0
    assert yaml.safe_load(Path(version, "hparams.yaml").read_text())["lr"] == 0.002
    hparams = _tensorboard_hparams(version)
    _check_merged(tmp_path, lambda section, key: hparams[f"{section}/{key}" if section else key])


def _tensorboard_hparams(folder: str) -> dict:
    """Every hyper-parameter of the HPARAMS plugin's session records in ``folder``'s event files (TensorBoard's reader)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import plugin_data_pb2

    out = {}
    for path in glob.glob(os.path.join(folder, "events.out.tfevents.*")):
        for event in EventFileLoader(path).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name != "hparams":
                    continue
                data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                if data.HasField("session_start_info"):
                    for k, v in data.session_start_info.hparams.items():
                        out[k] = getattr(v, v.WhichOneof("kind"))
    return out


@pytest.mark.slow
def test_csv_fragment(tmp_path, monkeypatch):
    import pandas as pd

    _fit(tmp_path, "csv", "--trainer.logger.init_args.save_dir", str(tmp_path / "csv"), monkeypatch=monkeypatch)
    (version,) = glob.glob(str(tmp_path / "csv" / "mmte" / "version_*"))
    assert pd.read_csv(Path(version, "metrics.csv"))["val_acc"].notna().any()
    hparams = yaml.safe_load(Path(version, "hparams.yaml").read_text())
    assert hparams["lr"] == 0.002
    _check_merged(tmp_path, lambda section, key: hparams[section][key] if section else hparams[key])


@pytest.mark.slow
def test_mlflow_fragment(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    fragment = yaml.safe_load((ROOT / "configs" / "loggers" / "mlflow.yaml").read_text())
    csv_logger, mlflow_logger = fragment["trainer"]["logger"]
    csv_logger["init_args"]["save_dir"] = str(tmp_path / "csv")
    mlflow_logger["init_args"].update(tracking_uri=uri, artifact_location=str(tmp_path / "art"))
    (tmp_path / "loggers.yaml").write_text(yaml.safe_dump(fragment))
    _fit(tmp_path, "mlflow", "--config", str(tmp_path / "loggers.yaml"), monkeypatch=monkeypatch)
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["mmte"])
    assert len(runs) == 1
    run = runs.iloc[0]
    assert float(run["params.lr"]) == 0.002 and 0.0 <= run["metrics.val_acc"] <= 1.0
    _check_merged(tmp_path, lambda section, key: run[f"params.{section}/{key}" if section else f"params.{key}"])
    client = mlflow.MlflowClient(uri)
    assert {"best", "last"} <= {a.path for a in client.list_artifacts(run["run_id"])}  # the checkpoints, by MMTECheckpoint's names
    assert any(a.path.endswith(".ckpt") for a in client.list_artifacts(run["run_id"], "best"))


@pytest.mark.slow
def test_wandb_offline_fragment(tmp_path):
    pytest.importorskip("wandb")
    _fit(tmp_path, "wandb-offline", "--trainer.logger.init_args.save_dir", str(tmp_path / "wb"))
    (run,) = glob.glob(str(tmp_path / "wb" / "wandb" / "offline-run-*" / "run-*.wandb"))
    records = _wandb_records(run)
    config = {k: v for r in records if r[0] == "config" for k, v in r[1].items()}
    history = [r[1] for r in records if r[0] == "history"]
    assert config["lr"] == 0.002
    _check_merged(tmp_path, lambda section, key: config[section][key] if section else config[key])
    assert any(0.0 <= h.get("val_acc", -1) <= 1.0 for h in history), history


def _wandb_records(path: str) -> list[tuple[str, dict]]:
    """``(kind, {key: value})`` of the config, history and summary records of an offline ``.wandb`` file, decoded
    with W&B's own record schema (``wandb.proto``); the file is W&B's 7-byte header then LevelDB's log framing."""
    import struct

    from wandb.proto import wandb_internal_pb2

    raw = Path(path).read_bytes()
    assert raw[:4] == b":W&B", raw[:7]
    pos, chunks, buf = 7, [], b""
    while pos + 7 <= len(raw):
        left = 32768 - pos % 32768  # records never straddle a 32 KiB block's 7-byte tail
        if left < 7:
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        buf, pos = buf + raw[pos + 7:pos + 7 + n], pos + 7 + n
        if kind in (1, 4):  # a full record, or the last piece of one
            chunks.append(buf)
            buf = b""
    out = []
    for chunk in chunks:
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(chunk)
        kind = rec.WhichOneof("record_type")
        if kind in ("config", "history", "summary"):
            items = rec.history.item if kind == "history" else getattr(rec, kind).update
            out.append((kind, {i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in items}))
    return out
