"""The `mmte` command: modalities table, convert, a one-line error with nothing left behind (also when it
comes once the trainer runs), predict output, and resume after SIGKILL ending with the same metrics as an
uninterrupted run. Bad data files and folders are refused by the DataModules (``tests/training``), an unknown
modality by the model (``tests/training/test_module.py``); ``tests/test_errors.py`` runs a row of each class
through the command."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from mmte.cli import main

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "recipes" / "quickstart.yaml"
TINY = ROOT / "configs" / "encoders" / "tiny.yaml"
FAST = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


def test_help_lists_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for cmd in ("fit", "validate", "test", "predict", "modalities", "convert"):
        assert f"\n  {cmd} " in out


def test_modalities_table(capsys):
    from mmte.tokenizers.registry import get_modality, list_modalities

    assert main(["modalities"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["modality", "tokenizer", "default"]
    rows = {ln.split()[0]: ln for ln in lines[2:]}
    assert set(rows) == set(list_modalities())
    for name, row in rows.items():
        spec = get_modality(name)
        assert spec.tokenizer.__name__ in row and spec.default_head["name"] in row


def test_convert_hf_folder_roundtrip(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from mmte.encoders import from_hf

    cfg = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                  max_position_embeddings=16)
    torch.manual_seed(0)
    hf = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    hf.save_pretrained(tmp_path / "bert")
    out = tmp_path / "bert.safetensors"
    assert main(["convert", "--from", "hf", str(tmp_path / "bert"), "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    sd = load_file(out)
    ref = from_hf(hf).backbone.state_dict()
    assert set(sd) == set(ref)
    for k in ref:
        torch.testing.assert_close(sd[k], ref[k], rtol=0, atol=0)
    # the file works as a recipe's backbone_weights: the model's backbone equals the HF model's layers
    from mmte.encoders import BackboneConfig
    from mmte.training.module import MMTEModule

    bcfg = from_hf(hf).backbone.config
    m = MMTEModule({"image": {"name": "image", "img_size": 8, "patch_size": 4, "in_chans": 1}},
                   {k: v for k, v in bcfg.__dict__.items()}, {"d": {"name": "classification"}},
                   backbone_weights=str(out), data_info={"num_classes": 3})
    m.configure_model()
    assert isinstance(bcfg, BackboneConfig)
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(m.model.backbone(x), hf.encoder(x).last_hidden_state, rtol=1e-5, atol=1e-5)


def test_convert_timm_with_local_checkpoint(tmp_path, capsys):
    timm = pytest.importorskip("timm")
    from safetensors.torch import load_file

    from mmte.encoders import from_timm

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False).eval()
    torch.save(model.state_dict(), tmp_path / "vit.pth")
    out = tmp_path / "vit.safetensors"
    assert main(["convert", "--from", "timm", "vit_tiny_patch16_224", "--checkpoint", str(tmp_path / "vit.pth"), "--out", str(out)]) == 0
    sd, ref = load_file(out), from_timm(model).backbone.state_dict()
    assert set(sd) == set(ref)
    for k in ref:
        torch.testing.assert_close(sd[k], ref[k], rtol=0, atol=0)
    capsys.readouterr()
    assert main(["convert", "--from", "timm", "vit_tiny_patch16_224", "--out", str(tmp_path / "x.pt")]) == 2
    assert "mmte: error: --out must end in .safetensors" in capsys.readouterr().err


def _bad(capsys, args, root: Path, needle: str):
    rc = main([*args, "--trainer.default_root_dir", str(root), *FAST])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    errors = [ln for ln in err if ln.startswith("mmte: error:")]
    assert len(errors) == 1 and needle in errors[0], err[-5:]
    assert not root.exists(), f"{root} was written: {list(root.rglob('*'))}"


def test_failure_after_start_leaves_nothing(tmp_path, capsys):
    """An error raised once the trainer runs (an empty validation split) still leaves no folders; a
    pre-existing root keeps what it had."""
    args = ["fit", "--config", str(QUICK), "--config", str(TINY), "--data.init_args.val_fraction", "0"]
    _bad(capsys, args, tmp_path / "r", "the 'val' split is empty")
    keep = tmp_path / "old"
    (keep / "mine").mkdir(parents=True)
    assert main([*args, "--trainer.default_root_dir", str(keep), *FAST]) == 2
    assert sorted(p.name for p in keep.iterdir()) == ["mine"]


def _last_metrics(root: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for f in sorted(root.glob("logs/version_*/metrics.csv")):
        with open(f) as fh:
            rows = list(csv.DictReader(fh))
        for r in rows:
            for k, v in r.items():
                if v not in ("", None):
                    out[k] = float(v)
    return out


def test_fit_then_predict_writes_csv_and_json(tmp_path, capsys):
    root = tmp_path / "run"
    base = ["--config", str(QUICK), "--config", str(TINY), "--trainer.default_root_dir", str(root), *FAST]
    assert main(["fit", *base, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "4"]) == 0
    ckpt = root / "checkpoints" / "last.ckpt"
    assert ckpt.is_file() and any(root.glob("logs/version_0/metrics.csv")) and any(root.glob("logs/version_0/config.yaml"))
    capsys.readouterr()
    assert main(["predict", *base, "--ckpt_path", str(ckpt)]) == 0
    out = capsys.readouterr().out
    assert "predictions (359 rows)" in out  # 20 % of each digit class, rounded
    with open(next(root.glob("logs/version_*/predictions.csv"))) as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 359 and set(rows[0]) == {"id", "pred", "prob", "target"}
    assert rows[0]["id"].startswith("digits[")
    assert all(r["pred"] in [str(i) for i in range(10)] and 0.0 < float(r["prob"]) <= 1.0 for r in rows)
    js = tmp_path / "p.json"
    assert main(["predict", *base, "--ckpt_path", str(ckpt), "--prediction_writer.output", str(js), "--prediction_writer.print_rows", "0"]) == 0
    data = json.loads(js.read_text())
    assert [r["pred"] for r in data] == [r["pred"] for r in rows]  # class names, same rows
    assert [r["id"] for r in data] == [r["id"] for r in rows]


def test_fit_ckpt_path_last_without_a_checkpoint_starts_from_scratch(tmp_path, capsys):
    root = tmp_path / "run"
    base = ["fit", "--config", str(QUICK), "--config", str(TINY), "--trainer.default_root_dir", str(root), *FAST,
            "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "0"]
    assert main([*base, "--ckpt_path", "last"]) == 0
    last = root / "checkpoints" / "last.ckpt"
    assert f"mmte: warning: --ckpt_path last: there is no {last} yet, so training starts from scratch" in capsys.readouterr().err
    assert torch.load(last, weights_only=False)["epoch"] == 0


KILLER = textwrap.dedent(
    """
    import os, signal
    from lightning.pytorch import Callback

    class KillAtEpoch(Callback):
        def __init__(self, epoch: int = 2):
            self.epoch = epoch

        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch == self.epoch:
                os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("ema", ["callback", "model"], ids=["ema-callback", "ema-model"])
def test_resume_after_sigkill_matches_uninterrupted(tmp_path, ema):
    """With a frozen 'pretrained' backbone from a file, so the checkpoints resumed from are trainable-only,
    and a weight average (Lightning's EMAWeightAveraging callback, or mmte's ``model.ema_decay``), whose
    checkpoints carry the averaged weights in ``state_dict`` and the live ones in ``current_model_state``
    (both trainable-only; both restored on resume). A resume without an average is
    tests/training/test_signals.py's SIGTERM case."""
    from safetensors.torch import save_file

    from mmte.encoders import Backbone

    torch.manual_seed(5)
    src = tmp_path / "pretrained-tiny.safetensors"
    save_file({k: v.contiguous() for k, v in Backbone("tiny").state_dict().items()}, str(src))
    (tmp_path / "killer.py").write_text(KILLER)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    common = [sys.executable, "-m", "mmte", "fit", "--config", str(QUICK), "--config", str(TINY), *FAST,
              "--trainer.max_epochs", "3", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2",
              "--data.init_args.batch_size", "16", "--model.lr", "0.003",
              "--model.backbone_weights", str(src), "--model.freeze", "backbone"]
    if ema == "callback":
        common += ["--trainer.callbacks+=lightning.pytorch.callbacks.EMAWeightAveraging", "--trainer.callbacks.decay", "0.9"]
    else:
        common += ["--model.ema_decay", "0.9"]

    def start(root, *extra):
        return subprocess.Popen([*common, "--trainer.default_root_dir", str(root), *extra], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)


    # the uninterrupted run and the one killed at epoch 2 are independent: they run at the same time
    a, killed = start(tmp_path / "a"), start(tmp_path / "b", "--trainer.callbacks+=killer.KillAtEpoch")
    a_err, killed_err = (p.communicate(timeout=600)[1] for p in (a, killed))
    assert a.returncode == 0, a_err[-2000:]
    assert killed.returncode == -signal.SIGKILL, killed_err[-2000:]
    ck = tmp_path / "b" / "checkpoints" / "last.ckpt"
    saved = torch.load(ck, weights_only=False)
    assert saved["epoch"] == 1 and saved["mmte"]["frozen"]["source"] == str(src)
    assert not any(k.startswith("model.backbone.") for k in saved["state_dict"])  # trainable part only
    live, avg = saved["current_model_state"], saved["state_dict"]
    assert set(live) == set(avg) and not any(k.startswith("model.backbone.") for k in live)
    if ema == "callback":
        assert saved["averaging_state"]["n_averaged"].item() == 6  # 2 epochs x 3 steps
    else:
        assert saved["mmte"]["ema"] == {"decay": 0.9, "updates": 6}
    head = next(k for k in avg if k.startswith("model.heads.") and k.endswith("weight"))
    assert not torch.equal(live[head], avg[head])  # the averaged weights are not the live ones
    assert not list((tmp_path / "b" / "checkpoints").glob(".tmp-*"))
    resumed = start(tmp_path / "b", "--ckpt_path", "last")
    resumed_err = resumed.communicate(timeout=600)[1]
    assert resumed.returncode == 0, resumed_err[-2000:]
    ma, mb = _last_metrics(tmp_path / "a"), _last_metrics(tmp_path / "b")
    assert ma["epoch"] == mb["epoch"] == 2
    for k in ("val_loss", "val_acc", "train_loss_epoch"):
        assert abs(ma[k] - mb[k]) <= 1e-6, (k, ma[k], mb[k])
    wa, wb = (torch.load(r / "checkpoints" / "last.ckpt", weights_only=False) for r in (tmp_path / "a", tmp_path / "b"))
    for part in ("state_dict", "current_model_state"):
        assert set(wa[part]) == set(wb[part])
        for k, v in wa[part].items():
            torch.testing.assert_close(wb[part][k], v, rtol=0, atol=1e-6, msg=f"{part} {k}")


def test_entry_flags_merge_into_the_recipe_entry(capsys):
    """``--model.heads.<name>.<option>`` changes one option of the recipe's head (the parser alone would
    replace the whole entry, dropping its name and other options silently); the same for tokenizers."""
    import yaml

    recipe = str(Path(__file__).resolve().parents[2] / "recipes" / "etth1_forecast.yaml")
    assert main(["fit", "--config", recipe, "--model.heads.forecast.dropout", "0.0", "--model.tokenizers.time_series.patch_len=8",
                 "--print_config"]) == 0
    model = yaml.safe_load(capsys.readouterr().out)["model"]
    assert model["heads"] == {"forecast": {"name": "forecasting", "num_patches": "auto", "dropout": 0.0}}
    assert model["tokenizers"] == {"time_series": {"name": "time_series", "patch_len": 8, "stride": 8, "max_patches": 64}}
    assert main(["fit", "--config", recipe, "--model.heads.fc.dropout", "0.0", "--print_config"]) == 2
    assert "mmte: error: --model.heads.fc.dropout: the model has no head 'fc', expected one of: forecast" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--model.heads.forecast.dropuot", "0.1"],
         "mmte: error: --model.heads.forecast.dropuot: no registered head has the option 'dropuot', expected one of name, inputs, "),
        (["--model.heads.forecast.dropout", "abc"],
         ("mmte: error: --model.heads.forecast.dropout is 'abc', expected float or null, fix the value (no quotes around numbers; "
         "mmte list heads shows the heads)")),
        (["--model.heads.forecast.num_patches", "many"], "mmte: error: --model.heads.forecast.num_patches is 'many', expected int or 'auto', 'mean' or null"),
        (["--model.tokenizers.time_series.patch_len=x"], "mmte: error: --model.tokenizers.time_series.patch_len is 'x', expected int or null"),
        (["--model.heads", "{forecast: {class_path: mmte.heads.ForecastingHead, init_args: {dropout: 0.1}}}"],
         ("mmte: error: model.heads.forecast is spelt {class_path: mmte.heads.ForecastingHead, init_args: ...}, expected name: <registry name "
         "or class path> with the options beside it, write forecast: {name: mmte.heads.ForecastingHead, dropout: 0.1}")),
    ],
)
def test_entry_options_are_typed_by_the_parser(flags, line, capsys):
    """An option no registered head (tokenizer) has, or a value of the wrong type, is the parser's error, shown as
    one line naming the entry, the option, the value and what was expected."""
    recipe = str(ROOT / "recipes" / "etth1_forecast.yaml")
    assert main(["fit", "--config", recipe, *flags, "--print_config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(line), err[-1]
    assert sum(ln.startswith("mmte: error:") for ln in err) == 1
    if "dropuot" in line:
        assert err[-1].endswith("(did you mean 'dropout'?), fix the spelling or drop it (mmte list heads shows the heads)")


def test_predict_rebuilds_the_model_from_the_checkpoint_config(tmp_path, capsys):
    """The checkpoint stores the typed heads and tokenizers as plain data: ``mmte predict --ckpt_path`` with a recipe
    that lacks the trained head option (and no ``--model`` flags) builds the trained model."""
    root = tmp_path / "run"
    base = ["--config", str(QUICK), "--config", str(TINY), "--trainer.default_root_dir", str(root), *FAST]
    assert main(["fit", *base, "--model.heads.digit.hidden", "16", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
                 "--trainer.limit_val_batches", "1"]) == 0
    ckpt = torch.load(root / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["hyper_parameters"]["heads"] == {"digit": {"name": "classification", "pool": "mean", "hidden": 16, "label_smoothing": 0.1}}
    assert ckpt["hyper_parameters"]["tokenizers"] == {"image": {"name": "image", "img_size": 8, "patch_size": 8, "in_chans": 1}}
    capsys.readouterr()
    assert main(["predict", *base, "--ckpt_path", "last", "--trainer.limit_predict_batches", "1", "--prediction_writer.print_rows", "0"]) == 0
    assert "mmte: error" not in capsys.readouterr().err
    assert main(["predict", *base, "--ckpt_path", "last", "--model.heads.digit.hidden", "32"]) == 2
    assert "mmte: error: --model.heads is " in capsys.readouterr().err  # an explicit flag must agree with the checkpoint


def test_command_line_trainer_precision_wins_over_the_recipe():
    """A recipe's ``precision: auto`` must not override ``--trainer.precision`` given on the command line."""
    from jsonargparse import Namespace

    from mmte.cli.checks import resolve_precision
    from mmte.errors import UsageError

    def cfg(trainer_precision):
        return Namespace(precision="auto", trainer=Namespace(precision=trainer_precision, plugins=None, accelerator="cpu"))

    c = cfg("32-true")
    resolve_precision(c, ["fit", "--config", "r.yaml", "--trainer.precision", "32-true"])
    assert c.trainer.precision == "32-true"
    c = cfg("bf16-mixed")
    resolve_precision(c, ["fit", "--trainer.precision=bf16-mixed"])
    assert c.trainer.precision == "bf16-mixed"
    c = cfg(None)  # no explicit trainer.precision: the recipe's precision decides
    resolve_precision(c, ["fit", "--config", "r.yaml"])
    assert c.trainer.precision in ("32-true", "bf16-mixed")
    with pytest.raises(UsageError, match=r"--precision 16-mixed and --trainer.precision 32-true disagree"):
        c = cfg("32-true")
        c.precision = "16-mixed"
        resolve_precision(c, ["fit", "--precision", "16-mixed", "--trainer.precision", "32-true"])


def test_fit_without_checkpointing(tmp_path):
    """``--trainer.enable_checkpointing false`` trains and writes no checkpoint (mmte's checkpoint callback
    is left out; Lightning refuses the callback together with the flag)."""
    root = Path(__file__).resolve().parents[2]
    assert main(["fit", "--config", str(root / "recipes" / "quickstart.yaml"), "--config", str(root / "configs" / "encoders" / "tiny.yaml"),
                 "--trainer.enable_checkpointing", "false", "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1",
                 "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path)]) == 0
    assert (tmp_path / "logs").is_dir() and not (tmp_path / "checkpoints").exists()


# ------------------------------------------------------------------ one behaviour for every verb
@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """A quickstart run (tiny backbone, a few steps) with best.ckpt and last.ckpt, and the recipe flags that name it."""
    root = tmp_path_factory.mktemp("verbs") / "run"
    base = ["--config", str(QUICK), "--config", str(TINY), "--trainer.default_root_dir", str(root), *FAST]
    assert main(["fit", *base, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]) == 0
    assert (root / "checkpoints" / "best.ckpt").is_file() and (root / "checkpoints" / "last.ckpt").is_file()
    return root, base


def test_ckpt_path_best_and_last_resolve_in_every_verb(quick_run, tmp_path, capsys):
    """``--ckpt_path best|last`` names ``<checkpoints>/{best,last}.ckpt`` in validate, predict and export alike,
    and a run without that file gets the same one-line error from each."""
    _, base = quick_run
    assert main(["validate", *base, "--ckpt_path", "best", "--trainer.limit_val_batches", "1"]) == 0
    assert main(["predict", *base, "--ckpt_path", "last", "--trainer.limit_predict_batches", "1", "--prediction_writer.print_rows", "0"]) == 0
    out = tmp_path / "m.pt2"
    capsys.readouterr()
    assert main(["export", *base, "--ckpt_path", "best", "--format", "torch_export", "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out} (torch_export;") and out.is_file()
    empty = ["--config", str(QUICK), "--config", str(TINY), "--trainer.default_root_dir", str(tmp_path / "none")]
    missing = tmp_path / "none" / "checkpoints" / "best.ckpt"
    want = (f"mmte: error: --ckpt_path best: there is no {missing}, expected the best checkpoint of an earlier mmte fit with this "
            "default_root_dir, run mmte fit first, or pass --ckpt_path <file>")
    for verb in (["validate"], ["predict"], ["export", "--format", "torch_export", "--out", str(tmp_path / "x.pt2")]):
        assert main([verb[0], *empty, "--ckpt_path", "best", *verb[1:]]) == 2, verb
        assert capsys.readouterr().err.strip().splitlines()[-1] == want, verb


def test_missing_optional_package_names_its_extra(tmp_path, monkeypatch, capsys):
    """An optional package that is not installed is one line naming ``pip install 'mmte[<extra>]'``."""
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` fails as if it were not installed
    assert main(["export", "--config", str(QUICK), "--config", str(TINY), *FAST, "--format", "onnx", "--out", str(tmp_path / "m.onnx")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "mmte: error: the optional package onnxruntime is not installed, expected the mmte[export] extra for this command, "
        "install it: pip install 'mmte[export]'")


def test_every_optional_package_maps_to_an_extra_of_pyproject():
    """Each import name :data:`mmte.cli.errors.EXTRAS` knows is a requirement of the extra it names."""
    import re

    from mmte.cli.errors import EXTRAS, describe_error

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    dist = {"open_clip": "open_clip_torch", "transformer_engine": "transformer-engine"}
    for module, extra in EXTRAS.items():
        names = [re.split(r"[<>=\[;\s]", r, maxsplit=1)[0] for r in extras[extra]]
        assert dist.get(module, module) in names, (module, extra, names)
        err = RuntimeError("wrapped")
        err.__cause__ = ModuleNotFoundError(f"No module named '{module}'", name=f"{module}.sub")
        line = f"the optional package {module} is not installed, expected the mmte[{extra}] extra for this command, install it: "
        assert describe_error(err) == (line + f"pip install 'mmte[{extra}]'", 2)


def test_explicit_precision_decides_the_inference_dtype():
    """With ``predict_dtype: auto``, ``--trainer.precision 32-true`` predicts in fp32 and ``bf16-*`` in bf16; an
    explicit ``--model.predict_dtype`` or a recipe's precision leaves it alone."""
    from jsonargparse import Namespace

    from mmte.cli.checks import resolve_predict_dtype

    def cfg(precision, predict_dtype="auto"):
        return Namespace(precision=None, model=Namespace(predict_dtype=predict_dtype),
                         trainer=Namespace(precision=precision, plugins=None, accelerator="cpu"))

    for precision, want in (("32-true", "fp32"), ("32", "fp32"), ("bf16-mixed", "bf16"), ("bf16-true", "bf16"), ("16-mixed", "auto")):
        c = cfg(precision)
        resolve_predict_dtype(c, ["predict", f"--trainer.precision={precision}"], "predict")
        assert c.model.predict_dtype == want, precision
    c = cfg("32-true", "bf16")
    resolve_predict_dtype(c, ["predict", "--trainer.precision", "32-true", "--model.predict_dtype", "bf16"], "predict")
    assert c.model.predict_dtype == "bf16"
    c = cfg("32-true")
    resolve_predict_dtype(c, ["predict", "--config", "recipe.yaml"], "predict")  # the recipe's precision: auto stays auto
    assert c.model.predict_dtype == "auto"
    c = cfg("32-true")
    resolve_predict_dtype(c, ["fit", "--trainer.precision", "32-true"], "fit")  # only predict builds the inference copy
    assert c.model.predict_dtype == "auto"


@pytest.mark.parametrize(("precision", "dtype"), [("32-true", "fp32"), ("bf16-mixed", "bf16")])
def test_predict_header_says_the_inference_dtype(quick_run, capsys, precision, dtype):
    """``mmte predict --trainer.precision P`` builds its inference copy in P's dtype and says so, with the flag that changes it."""
    _, base = quick_run
    assert main(["predict", *base, "--ckpt_path", "last", "--trainer.precision", precision, "--trainer.limit_predict_batches", "1",
                 "--prediction_writer.print_rows", "0"]) == 0
    err = capsys.readouterr().err
    assert f"mmte: predictions in {dtype} (from --trainer.precision {precision}); --model.predict_dtype fp32 or bf16 sets it" in err
    assert any(ln.startswith("mmte: inference model:") and f" in {dtype} " in ln for ln in err.splitlines()), err
