"""The inference path: MetaTransformer.inference() / mmte.inference.optimize against the eager fp32
model (bf16 and FP8 tolerances), the original model left alone, batch-size routing to the compiled
copy, and `mmte predict` through it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mmte import device as mdev
from mmte.inference import InferenceModel, optimize, resolve_dtype
from mmte.model import MetaTransformer

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "recipes" / "quickstart.yaml"
TINY = ROOT / "configs" / "encoders" / "tiny.yaml"


def _model() -> MetaTransformer:
    torch.manual_seed(0)
    return MetaTransformer(
        {"image": {"name": "image", "img_size": 16, "patch_size": 4, "in_chans": 1}},
        backbone="tiny",
        heads={"digit": {"name": "classification", "num_classes": 10, "pool": "mean"}},
        freeze="backbone",
    )


def _digits(n: int = 32) -> dict[str, torch.Tensor]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images[:n], dtype=torch.float32)[:, None] / 16.0
    return {"image": torch.nn.functional.interpolate(x, size=16), "label": torch.tensor(d.target[:n])}


def test_bf16_inference_is_close_to_eager_fp32_and_leaves_the_model_alone():
    model = _model().train()
    batch = _digits()
    with torch.no_grad():
        ref = model.eval()(batch)["digit"]
    model.train()
    inf = model.inference("bf16")
    assert isinstance(inf, InferenceModel) and inf.dtype == "bf16"
    out = inf(batch)["digit"]
    assert out.dtype == torch.float32 and out.is_inference()
    err = ((out - ref).norm() / ref.norm()).item()
    assert err < 2e-2, err
    assert (out.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.9
    # the copy holds bf16 backbone GEMM weights (norms in fp32 where the small-row path is on); tokenizer
    # and head stay fp32; the original is untouched
    backbone = inf.model.backbone
    assert {m.weight.dtype for m in backbone.modules() if isinstance(m, torch.nn.Linear)} == {torch.bfloat16}
    norm_dtype = torch.float32 if backbone.small_rows else torch.bfloat16
    assert {m.weight.dtype for m in backbone.modules() if isinstance(m, torch.nn.LayerNorm)} == {norm_dtype}
    assert {p.dtype for p in inf.model.heads.parameters()} == {torch.float32}
    assert {p.dtype for p in model.parameters()} == {torch.float32} and model.training
    assert not any(p.requires_grad for p in inf.parameters())
    with pytest.raises(RuntimeError, match="an InferenceModel is for prediction only; train the original model"):
        inf.train()


def test_fp32_and_fp8_inference():
    model = _model().eval()
    batch = _digits(16)
    with torch.no_grad():
        ref = model(batch)["digit"]
    fp32 = optimize(model, "fp32")
    # the prepacked GEMMs (oneDNN's blocked layout) sum in another order than F.linear: same to ~1e-6
    torch.testing.assert_close(fp32(batch)["digit"], ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(optimize(model, "fp32", prepack=False)(batch)["digit"], ref)
    fp8 = optimize(model, "fp8")
    from mmte.fp8 import FP8Linear

    assert sum(isinstance(m, FP8Linear) for m in fp8.modules()) == 4 * model.backbone.config.num_layers
    out = fp8(batch)["digit"]
    assert ((out - ref).norm() / ref.norm()).item() < 0.1  # E4M3 weights and activations


def test_fp32_inference_copy_under_bf16_autocast():
    """Under bf16 autocast (Lightning's bf16-mixed predict) the prepacked fp32 copy runs the backbone's
    bf16 path, as the plain model does; the packed fp32 GEMMs never see a bf16 activation."""
    model = _model().eval()
    batch = _digits(7)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = model(batch)["digit"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = optimize(model, "fp32")(batch)["digit"]
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(not __import__("mmte.inference", fromlist=["small_available"]).small_available(), reason="no fbgemm fp16 GEMM here")
@pytest.mark.parametrize("n", [1, 2])
def test_bf16_copy_few_rows_under_bf16_autocast(n):
    """A batch of a few token rows takes the bf16 copy's fp32 small-row path; under bf16 autocast (bf16-mixed
    prediction of one or two items) it answers as without autocast, instead of handing its fp32 GEMMs bf16
    activations."""
    torch.manual_seed(0)
    model = MetaTransformer({"image": {"name": "image", "img_size": 8, "patch_size": 8, "in_chans": 1}}, backbone="tiny",
                            heads={"digit": {"name": "classification", "num_classes": 10, "pool": "mean"}}).eval()
    inf = optimize(model, "bf16")
    batch = {"image": torch.nn.functional.interpolate(_digits(n)["image"], size=8)}  # one token (+ cls) an item
    ref = inf(batch)["digit"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = inf(batch)["digit"]
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_auto_dtype_and_bad_values(monkeypatch):
    amx = mdev.CPUInfo("AMX box", "AVX512", ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f"), 2, 2)
    monkeypatch.setattr(mdev, "cpu_info", lambda path="/proc/cpuinfo": amx)
    assert resolve_dtype("auto") == "bf16"
    assert optimize(_model(), "auto").dtype == "bf16"  # native bf16 units: the bf16 copy
    avx2 = mdev.CPUInfo("AVX2 box", "AVX2", ("avx2", "fma"), 2, 2)
    monkeypatch.setattr(mdev, "cpu_info", lambda path="/proc/cpuinfo": avx2)
    assert resolve_dtype("auto") == "fp32"
    assert optimize(_model(), "auto").dtype == "fp32"  # never bf16 where it is emulated
    with pytest.raises(ValueError, match=r"inference dtype must be one of \('auto', 'bf16', 'fp32', 'fp8'\); got 'int4'"):
        optimize(_model(), "int4")
    with pytest.raises(ValueError, match="inference dtype 'bf16' applies to mmte backbones; Linear holds none"):
        optimize(torch.nn.Linear(3, 3), "bf16")


def test_compiled_copy_serves_large_batches_and_shares_weights(monkeypatch):
    model = _model().eval()
    inf = optimize(model, "bf16", compile=True, compile_min_batch=4)
    assert inf.compiled is not None and inf.compiled.backbone.fused and not inf.model.backbone.fused
    shared = {id(p) for p in inf.model.parameters()}
    assert all(id(p) in shared for p in inf.compiled.parameters())
    calls = []
    monkeypatch.setattr(inf.compiled, "forward", lambda b: calls.append(len(b["image"])) or {"digit": b["image"]})
    inf(_digits(2))
    inf(_digits(8))
    assert calls == [8]  # batch 2 ran the eager copy


@pytest.mark.slow
def test_compiled_bf16_equals_eager_bf16():
    model = _model().eval()
    batch = _digits(8)
    eager = optimize(model, "bf16")(batch)["digit"]
    comp = optimize(model, "bf16", compile=True)(batch)["digit"]
    assert ((comp - eager).norm() / eager.norm()).item() < 1e-2


def test_mmte_predict_uses_the_inference_path(tmp_path, capsys):
    from mmte.cli import main

    root = tmp_path / "run"
    common = ["--config", str(QUICK), "--config", str(TINY), "--trainer.default_root_dir", str(root),
              "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    assert main(["fit", *common, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "1"]) == 0
    ckpt = root / "checkpoints" / "last.ckpt"
    preds = {}
    for dtype in ("fp32", "auto"):
        out = tmp_path / f"{dtype}.json"
        assert main(["predict", *common, "--ckpt_path", str(ckpt), "--model.predict_dtype", dtype,
                     "--prediction_writer.output", str(out)]) == 0
        preds[dtype] = json.loads(out.read_text())
    capsys.readouterr()
    p32, pauto = ([r["pred"] for r in preds[k]] for k in ("fp32", "auto"))
    assert len(p32) == len(pauto) == 359
    same = sum(a == b for a, b in zip(p32, pauto, strict=True)) / len(p32)
    assert same >= 0.97, same
