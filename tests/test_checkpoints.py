"""Checkpoints through ``mmte fit``: ``last.ckpt`` is always the latest step, ``best.ckpt`` the best by the monitor
(and ``--ckpt_path best``/``last`` work from a new command), a re-run overwrites them, a failed write leaves no
temporary file and the previous checkpoint intact, and a non-finite loss or metric never becomes "best"."""

from __future__ import annotations

import csv
import errno
import hashlib
import textwrap
from pathlib import Path

# datasets, lightning, torchmetrics: imported while pytest collects, so the log handlers they add bind to the
# session's stderr, not to the capsys stream of the test that imports them first (closed after it)
import datasets  # noqa: F401
import lightning.pytorch  # noqa: F401
import torch
import torchmetrics  # noqa: F401

from mmte.cli import main

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["--config", str(ROOT / "recipes" / "quickstart.yaml"), "--config", str(ROOT / "configs" / "encoders" / "tiny.yaml")]
FAST = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", "--trainer.limit_train_batches", "3",
        "--trainer.limit_val_batches", "2", "--data.init_args.batch_size", "16"]


def _val_losses(root: Path) -> dict[int, float]:
    """epoch -> val_loss of the newest log version."""
    f = max(root.glob("logs/version_*/metrics.csv"))
    with open(f) as fh:
        return {int(r["epoch"]): float(r["val_loss"]) for r in csv.DictReader(fh) if r.get("val_loss")}


def _ckpt(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_last_is_latest_best_is_best_and_a_rerun_overwrites(tmp_path, capsys):
    """Monitoring val_loss in "max" mode makes the best epoch an early one: Lightning only refreshed last.ckpt
    when a new best was saved, so last.ckpt stayed at that epoch."""
    from mmte.cli import MMTECLI

    root = tmp_path / "run"
    base = [*QUICK, *FAST, "--trainer.default_root_dir", str(root)]
    assert main(["fit", *base, "--trainer.max_epochs", "3", "--checkpoint.monitor", "val_loss", "--checkpoint.mode", "max"]) == 0
    ck = root / "checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == ["best.ckpt", "last.ckpt"]
    losses = _val_losses(root)
    best_epoch = max(losses, key=losses.get)
    assert best_epoch != 2, f"the premise (best is not the last epoch) does not hold: {losses}"
    last, best = _ckpt(ck / "last.ckpt"), _ckpt(ck / "best.ckpt")
    assert (last["epoch"], last["global_step"]) == (2, 9)
    assert (best["epoch"], best["global_step"]) == (best_epoch, 3 * (best_epoch + 1))
    state = next(v for k, v in last["callbacks"].items() if k.startswith("MMTECheckpoint"))
    assert state["best_model_path"] == str(ck / "best.ckpt") and abs(float(state["best_model_score"]) - losses[best_epoch]) < 1e-6

    # a second run into the same folder replaces both files (no last-v1.ckpt)
    assert main(["fit", *base, "--trainer.max_epochs", "1"]) == 0
    assert sorted(p.name for p in ck.iterdir()) == ["best.ckpt", "last.ckpt"]
    assert _ckpt(ck / "last.ckpt")["global_step"] == 3 and _ckpt(ck / "best.ckpt")["global_step"] == 3
    rerun_loss = _val_losses(root)[0]

    # best / last resolve to those files in a new command (Lightning only knows "best" inside the fit)
    capsys.readouterr()
    for name in ("best", "last"):
        cli = MMTECLI(args=["validate", *base, "--ckpt_path", name])
        assert cli.trainer.ckpt_path == str(ck / f"{name}.ckpt")
        assert abs(float(cli.trainer.callback_metrics["val_loss"]) - rerun_loss) < 1e-6


def test_save_top_k_keeps_ranked_files_and_a_best_copy(tmp_path):
    root = tmp_path / "run"
    assert main(["fit", *QUICK, *FAST, "--trainer.default_root_dir", str(root), "--trainer.max_epochs", "3", "--checkpoint.save_top_k", "2"]) == 0
    ck = root / "checkpoints"
    names = sorted(p.name for p in ck.iterdir())
    ranked = [n for n in names if n.startswith("epoch=")]
    assert len(ranked) == 2 and names == sorted([*ranked, "best.ckpt", "last.ckpt"]), names
    state = next(v for k, v in _ckpt(ck / "last.ckpt")["callbacks"].items() if k.startswith("MMTECheckpoint"))
    assert _sha(ck / "best.ckpt") == _sha(Path(state["best_model_path"]))


def test_a_failed_write_removes_its_temp_file_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch, capsys):
    """Disk full while writing: the half-written temporary file goes, the old best/last stay, one line says why."""
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    root = tmp_path / "run"
    base = [*QUICK, *FAST, "--trainer.default_root_dir", str(root), "--trainer.max_epochs", "1"]
    assert main(["fit", *base]) == 0
    ck = root / "checkpoints"
    before = {p.name: _sha(p) for p in ck.iterdir()}

    def full_disk(self, checkpoint, path, storage_options=None):
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(TorchCheckpointIO, "save_checkpoint", full_disk)
    capsys.readouterr()
    assert main(["fit", *base]) == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("mmte: error:")]
    assert err == [
        (
            f"mmte: error: could not write {ck}/best.ckpt (No space left on device, ENOSPC); its temporary file was removed and the previous "
            "best.ckpt (if any) is unchanged, expected free disk space and a writable folder, free some space or point "
            "--trainer.default_root_dir (or --checkpoint.dirpath) at another folder"
        )
    ]
    assert {p.name: _sha(p) for p in ck.iterdir()} == before  # no .tmp-* left, nothing replaced


POISON = textwrap.dedent(
    """
    import torch
    from lightning.pytorch import Callback

    class PoisonAt(Callback):
        '''Puts a NaN into the classification head's last weight after global step ``step``.'''

        def __init__(self, step: int = 4):
            self.step = step

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == self.step:
                w = [p for n, p in pl_module.named_parameters() if n.startswith("model.heads.")][-1]
                with torch.no_grad():
                    w.view(-1)[0] = float("nan")
    """
)


def test_nan_loss_stops_naming_the_step_and_never_becomes_best(tmp_path, monkeypatch, capsys):
    (tmp_path / "poison.py").write_text(POISON)
    monkeypatch.syspath_prepend(str(tmp_path))
    root = tmp_path / "run"
    rc = main(["fit", *QUICK, *FAST, "--trainer.default_root_dir", str(root), "--trainer.max_epochs", "3",
               "--trainer.callbacks+=poison.PoisonAt", "--trainer.callbacks.step", "4"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("mmte: error:")]
    ck = root / "checkpoints"
    assert rc == 1
    assert err == [
        (
            "mmte: error: the training loss is nan at step 4 (epoch 1, batch 1); stopped before its optimizer step, expected a finite loss, lower "
            f"--model.lr, check the data for NaN/inf values or use fp32; the last good checkpoint is {ck}/last.ckpt (resume with --ckpt_path last)"
        )
    ]
    assert sorted(p.name for p in ck.iterdir()) == ["best.ckpt", "last.ckpt"]
    for name in ("best.ckpt", "last.ckpt"):
        c = _ckpt(ck / name)
        assert c["global_step"] == 3 and all(bool(torch.isfinite(v).all()) for v in c["state_dict"].values() if v.is_floating_point())


def test_a_nonfinite_metric_is_never_ranked_best(tmp_path):
    """A toy module beside the real runs above: the monitored metric is 1, NaN, 0.5, inf by epoch."""
    import lightning.pytorch as pl

    from mmte.training.callbacks import MMTECheckpoint

    values = [1.0, float("nan"), 0.5, float("inf")]

    class Toy(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 1)

        def training_step(self, batch, i):
            return self.lin(batch).pow(2).mean()

        def validation_step(self, batch, i):
            self.log("m", values[self.current_epoch])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.randn(4, 2), batch_size=2)
    cb = MMTECheckpoint(monitor="m", mode="min", dirpath=str(tmp_path))
    trainer = pl.Trainer(max_epochs=4, callbacks=[cb], logger=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, default_root_dir=str(tmp_path))
    trainer.fit(Toy(), data, data)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.ckpt", "last.ckpt"]
    assert _ckpt(tmp_path / "best.ckpt")["epoch"] == 2 and float(cb.best_model_score) == 0.5
    assert _ckpt(tmp_path / "last.ckpt")["epoch"] == 3


def test_resumable_loader_continues_mid_epoch_exactly():
    """The loader's state after k batches, loaded into a fresh loader, yields exactly the rest of that epoch; a
    state at the end of an epoch starts the next one."""
    from mmte.training.data import train_sampler as EpochSeededSampler
    from mmte.training.guards import ResumableDataLoader

    def loader():
        return ResumableDataLoader(list(range(23)), batch_size=4, sampler=EpochSeededSampler(23, seed=3))

    a = loader()
    a.sampler.set_epoch(2)
    it = iter(a)
    seen = [next(it).tolist() for _ in range(3)]
    state = a.state_dict()
    rest = [b.tolist() for b in it]
    assert state == {"mmte_resumable": 1, "epoch": 2, "batches": 3}
    b = loader()
    b.load_state_dict(state)
    assert [x.tolist() for x in b] == rest and len(seen) + len(rest) == len(b) == 6
    assert b.state_dict() == {"mmte_resumable": 1, "epoch": 2, "batches": 6}  # skipped + yielded
    c = loader()
    c.load_state_dict({"mmte_resumable": 1, "epoch": 2, "batches": 3})
    c.sampler.set_epoch(3)  # Lightning moved on to another epoch: nothing is skipped
    full = [x.tolist() for x in c]
    assert len(full) == 6 and sorted(v for bt in full for v in bt) == list(range(23))
