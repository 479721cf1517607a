"""`mmte export`: a checkpoint of the quickstart recipe (tiny backbone) to ONNX and to a torch.export
program, each checked against the eager model on a real batch (the printed max abs diff), then run
independently (onnxruntime / torch.export.load) at another batch size; bad arguments give one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from mmte.cli import main
from mmte.data import collate_batch

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "recipes" / "quickstart.yaml"
TINY = ROOT / "configs" / "encoders" / "tiny.yaml"
COMMON = ["--config", str(QUICK), "--config", str(TINY), "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("export") / "run"
    assert main(["fit", *COMMON, "--trainer.default_root_dir", str(root), "--trainer.max_epochs", "1",
                 "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "1"]) == 0
    return root / "checkpoints" / "last.ckpt"


def _eager_and_batch(ckpt: Path, n: int, tmp_path: Path):
    """The checkpoint's model as Lightning loads it (eval mode) and n real digits (the rows the export did not
    see first) from the recipe's DataModule: a reference built without the export's own code."""
    from mmte.cli import MMTECLI
    from mmte.training.module import MMTEModule

    cli = MMTECLI(args=[*COMMON, "--trainer.logger", "false", "--trainer.default_root_dir", str(tmp_path / "ref")], run=False)
    dm = cli.datamodule
    dm.setup("predict")
    ds = dm.datasets[dm.predict_split]
    batch = collate_batch([ds[i] for i in range(20, 20 + n)], dm.collates_for("eval"))
    module = MMTEModule.load_from_checkpoint(ckpt, map_location="cpu")
    return module.model.eval(), batch


def _printed_diff(out: str, path: Path, fmt: str) -> float:
    m = re.search(rf"^wrote {re.escape(str(path))} \({fmt}; inputs \['image'\], outputs \['digit'\], dynamic batch\): "
                  r"max abs diff vs the eager model (\S+) on a batch of 8$", out, re.MULTILINE)
    assert m, out
    return float(m.group(1))


def test_export_onnx_matches_eager(trained, tmp_path, capsys):
    ort = pytest.importorskip("onnxruntime")
    out = tmp_path / "model.onnx"
    assert main(["export", *COMMON, "--ckpt_path", str(trained), "--format", "onnx", "--out", str(out)]) == 0
    diff = _printed_diff(capsys.readouterr().out, out, "onnx")
    assert diff < 1e-4
    model, batch = _eager_and_batch(trained, 5, tmp_path)  # another batch size: the batch dimension is dynamic
    with torch.no_grad():
        ref = model({"image": batch["image"]})["digit"]
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["image"] and [o.name for o in sess.get_outputs()] == ["digit"]
    (got,) = sess.run(None, {"image": batch["image"].numpy()})
    assert got.shape == (5, 10)
    assert (torch.from_numpy(got) - ref).abs().max().item() < 1e-4


def test_export_torch_program_matches_eager(trained, tmp_path, capsys):
    out = tmp_path / "model.pt2"
    assert main(["export", *COMMON, "--ckpt_path", str(trained), "--format", "torch_export", "--out", str(out)]) == 0
    diff = _printed_diff(capsys.readouterr().out, out, "torch_export")
    assert diff < 1e-5
    model, batch = _eager_and_batch(trained, 3, tmp_path)
    with torch.no_grad():
        ref = model({"image": batch["image"]})["digit"]
        (got,) = torch.export.load(str(out)).module()(batch["image"])
    assert (got - ref).abs().max().item() < 1e-5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "onnx", "--out", "x.pt2"], "mmte: error: --out for format 'onnx' must end in .onnx; got 'x.pt2'"),
        (["--format", "onnx", "--out", "x.onnx", "--opset", "16"], "mmte: error: ONNX opset must be >= 17 (LayerNormalization); got 16"),
        (["--out", "x.onnx", "--batch_size", "1"],
         "mmte: error: --batch_size must be >= 2 (a batch of 1 would fix the batch dimension); got 1"),
    ],
)
def test_export_bad_arguments(args, message, capsys, tmp_path):
    args = [a if not a.startswith("x.") else str(tmp_path / a) for a in args]
    message = message.replace("'x.", f"'{tmp_path}/x.")
    assert main(["export", *COMMON, *args]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == message


def test_export_needs_a_recipe(capsys):
    assert main(["export", "--out", "m.onnx"]) == 2
    assert capsys.readouterr().err.strip() == "mmte: error: mmte export needs the recipe: --config recipes/<name>.yaml"
