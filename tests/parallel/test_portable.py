"""Portable checkpoints through the real ``mmte`` runs on the quickstart (frozen pretrained MiniLM):

* a run that moves between layouts at epoch boundaries (TP=2 -> DDP over 2 replicas -> one process, an
  epoch of 2 steps each) ends with the losses of one uninterrupted single-process run (within 1e-4, fp32);
* a TP=2 checkpoint predicts on one process as the TP=2 model does (probabilities within 1e-5);
* a distributed (DCP) checkpoint folder is usable on one process directly and through
  ``mmte convert <folder> <file>``, with the same predictions;
* the checkpoints hold only the trainable part plus the frozen backbone's source and fingerprint.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ._launch import REPO, launch

TP2 = str(REPO / "configs" / "parallel" / "tp2.yaml")
DDP = str(REPO / "configs" / "parallel" / "ddp.yaml")


def _args(tmp: Path, name: str, *extra: str, batch: int = 64) -> list[str]:
    return ["--config", str(REPO / "recipes" / "quickstart.yaml"), "--precision", "32-true", "--trainer.max_epochs", "3",
            "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1", "--trainer.limit_predict_batches", "1",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", "--model.predict_dtype", "fp32",
            "--data.init_args.batch_size", str(batch), "--trainer.default_root_dir", str(tmp / name), *extra]


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_checkpoints_move_between_layouts_and_to_one_process(tmp_path):
    # epoch 1 under TP=2 (portable file) and, separately, under TP=2 writing a DCP folder
    a = launch(2, {
        "tp2": _args(tmp_path, "tp2", "--config", TP2, "--stop_after_epoch", "1"),
        "tp2_dcp": _args(tmp_path, "tp2_dcp", "--config", TP2, "--stop_after_epoch", "1",
                         "--trainer.strategy.init_args.save_distributed_checkpoint", "true"),
    }, tmp_path / "l2", 1200)
    assert "error" not in a["tp2"] and "error" not in a["tp2_dcp"], a
    tp2_ckpt = tmp_path / "tp2" / "checkpoints" / "last.ckpt"
    dcp = tmp_path / "tp2_dcp" / "checkpoints" / "last.ckpt"
    assert tp2_ckpt.is_file() and dcp.is_dir() and (dcp / ".metadata").is_file()
    ck = torch.load(tp2_ckpt, map_location="cpu", weights_only=False)
    assert ck["mmte"]["frozen"]["source"] == "minilm-l6" and not any(k.startswith("model.backbone.") for k in ck["state_dict"])
    assert ck["mmte"]["optimizer_format"] == "fqn-flat"

    # epoch 2 under DDP (resumed from the TP=2 file; batch 32 per replica), predictions of the TP=2 checkpoint under TP=2
    b = launch(2, {
        "ddp": _args(tmp_path, "ddp", "--config", DDP, "--ckpt_path", str(tp2_ckpt), "--stop_after_epoch", "2", batch=32),
        "tp2_predict": ["predict", *_args(tmp_path, "tp2p", "--config", TP2, "--ckpt_path", str(tp2_ckpt))],
    }, tmp_path / "l3", 1200)
    assert "error" not in b["ddp"] and "error" not in b["tp2_predict"], b

    # epoch 3 on one process (resumed from the DDP file); predictions of every TP=2 checkpoint on one process
    from mmte.cli import main

    converted = tmp_path / "converted.ckpt"
    assert main(["convert", str(dcp), str(converted)]) == 0
    # the user's route: mmte predict --ckpt_path <folder> on one process consolidates it on the fly
    assert main(["predict", *_args(tmp_path, "p0", "--ckpt_path", str(dcp), "--prediction_writer.output", str(tmp_path / "p0.csv"))]) == 0
    assert (tmp_path / "p0" / "last.ckpt.consolidated.ckpt").is_file() and (tmp_path / "p0.csv").is_file()
    c = launch(1, {  # and, in the same launch, the uninterrupted single-process reference
        "ref": _args(tmp_path, "ref"),
        "one": _args(tmp_path, "one", "--ckpt_path", str(tmp_path / "ddp" / "checkpoints" / "last.ckpt")),
        "p_file": ["predict", *_args(tmp_path, "p1", "--ckpt_path", str(tp2_ckpt))],
        "p_folder": ["predict", *_args(tmp_path, "p2", "--ckpt_path", str(dcp))],
        "p_converted": ["predict", *_args(tmp_path, "p3", "--ckpt_path", str(converted))],
    }, tmp_path / "l4", 900)
    for k, v in c.items():
        assert "error" not in v, (k, v)

    ref = c["ref"]
    assert len(ref["losses"]) == 6
    chained = a["tp2"]["losses"] + b["ddp"]["losses"] + c["one"]["losses"]
    assert len(chained) == 6
    worst = max(abs(x - y) for x, y in zip(chained, ref["losses"]))
    assert worst <= 1e-4, (worst, chained, ref["losses"])

    want = torch.tensor(b["tp2_predict"]["probs"])
    assert want.shape[0] > 0
    for k in ("p_file", "p_folder", "p_converted"):
        got = torch.tensor(c[k]["probs"])
        assert got.shape == want.shape, k
        assert float((got - want).abs().max()) <= 1e-5, (k, float((got - want).abs().max()))
