"""docs/extending.md, run: examples/ecg.py (a modality and a head in one file) used from Python, from a YAML
recipe through ``mmte fit`` / ``mmte predict`` (class paths, no packaging) and as an installed plug-in
(entry points); registration by decorators keeps the registries' names and specs."""

from __future__ import annotations

import csv
import functools
import re
import runpy
import shutil
import sys
from pathlib import Path

import pytest
import torch

from mmte.cli import main
from mmte.heads import HEADS, list_heads
from mmte.tokenizers import registry

from .tokenizers import contract, helpers

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending.md"
EXAMPLE = ROOT / "examples" / "ecg.py"
RECIPE = ROOT / "examples" / "ecg.yaml"
FIXTURE = ROOT / "tests" / "fixtures" / "mmte_ecg_plugin"
FAST = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)


def _forget_example() -> None:
    for name in ("ecg",):
        registry.MODALITIES.unregister(name)
    HEADS.unregister("attention_pool")
    for mod in ("examples.ecg", "examples.ecg_data", "examples"):
        sys.modules.pop(mod, None)


@pytest.fixture
def on_path(monkeypatch):
    """The repository root on sys.path (what ``PYTHONPATH=.`` does), with nothing of the example imported
    or registered before the test and after it."""
    _forget_example()
    assert "ecg" not in registry.list_modalities() and "attention_pool" not in list_heads()
    monkeypatch.syspath_prepend(str(ROOT))
    yield
    _forget_example()


@pytest.fixture
def ecg(on_path):
    import examples.ecg

    return examples.ecg


@pytest.fixture
def ecg_folder(tmp_path) -> Path:
    sys.path.insert(0, str(ROOT))
    try:
        from examples.ecg_data import write_folder
    finally:
        sys.path.remove(str(ROOT))
    d = tmp_path / "ecg_data"
    write_folder(str(d), per_class=6, seed=0)
    return d


# ------------------------------------------------------------------------------------------- the file
def test_the_doc_shows_the_example_file_and_it_fits_in_60_lines():
    text = EXAMPLE.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 60, len(text.splitlines())
    assert _blocks("python")[0] == text, "docs/extending.md's first code block must be examples/ecg.py, verbatim"


def test_registration_names_and_specs_unchanged_by_the_decorators():
    """The eleven tokenizer modules register by a decorator on the class (no ``_register()`` blocks); the
    names, classes, preprocessing, collate and default heads are the ones registered before."""
    def name(f):
        if isinstance(f, functools.partial):
            return f"partial({name(f.func)}, {sorted(f.keywords)})"
        return f"{f.__module__}.{f.__qualname__}" if f is not None else None

    expected = {
        "audio": ("mmte.tokenizers.audio.AudioTokenizer", "mmte.data.audio.preprocess_audio", "mmte.data.audio.collate_audio", "classification"),
        "graph": ("mmte.tokenizers.graph.GraphTokenizer", "mmte.data.graph.preprocess_graph", "mmte.data.graph.collate_graphs", "classification"),
        "hyperspectral": ("mmte.tokenizers.hyperspectral.HyperspectralTokenizer", "mmte.data.hyperspectral.extract_patch",
                          "mmte.data.hyperspectral.collate_cubes", "classification"),
        "image": ("mmte.tokenizers.image.ImageTokenizer", "mmte.data.image.preprocess_image", "mmte.data.image.collate_images", "classification"),
        "imu": ("mmte.tokenizers.imu.IMUTokenizer", "mmte.data.imu.preprocess_imu", "mmte.data.imu.collate_imu", "classification"),
        "infrared": ("mmte.tokenizers.infrared.InfraredTokenizer", "partial(mmte.data.image.preprocess_image, ['channels', 'mean', 'std'])",
                     "mmte.data.image.collate_images", "classification"),
        "point_cloud": ("mmte.tokenizers.point_cloud.PointCloudTokenizer", "mmte.data.point_cloud.preprocess_points",
                        "mmte.data.point_cloud.collate_points", "classification"),
        "tabular": ("mmte.tokenizers.tabular.TabularTokenizer", "mmte.data.tabular.TabularEncoder", "mmte.data.tabular.collate_tabular", "classification"),
        "text": ("mmte.tokenizers.text.TextTokenizer", "mmte.data.text.TextVocab", "mmte.data.text.collate_text", "classification"),
        "time_series": ("mmte.tokenizers.time_series.TimeSeriesTokenizer", "mmte.data.time_series.preprocess_series",
                        "mmte.data.time_series.collate_series", "forecasting"),
        "video": ("mmte.tokenizers.video.VideoTokenizer", "mmte.data.video.preprocess_video", "mmte.data.video.collate_video", "classification"),
        "xray": ("mmte.tokenizers.infrared.XRayTokenizer", "partial(mmte.data.image.preprocess_image, ['channels', 'mean', 'std'])",
                 "mmte.data.image.collate_images", "classification"),
    }
    got = {n: (name(s.tokenizer), name(s.preprocess), name(s.collate), s.default_head["name"]) for n, s in registry.MODALITIES.items()
           if s.tokenizer.__module__.startswith("mmte.")}
    assert got == expected
    assert {n: name(c) for n, c in HEADS.items() if c.__module__.startswith("mmte.")} == {
        "classification": "mmte.heads.heads.ClassificationHead", "contrastive": "mmte.heads.heads.ContrastiveHead",
        "forecasting": "mmte.heads.heads.ForecastingHead", "regression": "mmte.heads.heads.RegressionHead", "token": "mmte.heads.heads.TokenHead"}
    blocks = [str(p.relative_to(ROOT)) for p in (ROOT / "mmte").rglob("*.py") if re.search(r"^def _register\(", p.read_text(), re.MULTILINE)]
    assert blocks == ["mmte/training/strategy.py"], blocks  # Lightning's strategy registry: a loop over named presets


# --------------------------------------------------------------------------------------- 1. Python
def test_python_route_runs_as_written(on_path, tmp_path, capsys):
    code = _blocks("python")[1]
    assert "import examples.ecg" in code
    script = tmp_path / "python_route.py"  # the doc's block, run as the user's own script
    script.write_text(code, encoding="utf-8")
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    loss = float(re.search(r"loss after 3 steps: ([\d.]+)", out).group(1))
    assert 0.0 < loss < 5.0
    assert registry.get_modality("ecg").tokenizer.__module__ == "examples.ecg"
    assert HEADS.get("attention_pool").task == "classification"


def test_ecg_meets_the_registry_contract(ecg, monkeypatch):
    """What the registry sweep checks for every built-in modality, on the example."""
    monkeypatch.setitem(helpers.HEAD_REQUIRED, "attention_pool", {"num_classes": 5})
    for size in (0, 1):
        contract.check_forward_shape_no_nan("ecg", size)
    for policy in contract.POLICIES:
        contract.check_backward_reaches_exactly_trainable("ecg", policy)
    contract.check_meta_construction_and_reset("ecg")
    contract.check_padding_is_masked("ecg")
    # the head: attention weights over the real tokens only (a padded token changes nothing)
    torch.manual_seed(0)
    head = ecg.AttentionPoolHead(8, 3)
    hidden = torch.randn(2, 5, 8)
    from mmte.tokenizers import TokenSeq

    mask = torch.tensor([[True, True, True, False, False], [True] * 5])
    out = head(hidden, TokenSeq(hidden, mask))
    w = head.score(hidden[0, :3]).squeeze(-1).softmax(-1)
    torch.testing.assert_close(out[0], head.mlp((w[:, None] * hidden[0, :3]).sum(0)), rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------------------- 2. YAML
def test_yaml_route_mmte_fit_and_predict(on_path, ecg_folder, tmp_path, capsys):
    """``PYTHONPATH=. mmte fit --config examples/ecg.yaml``: class paths, no packaging; the checkpoint keeps
    them, so ``mmte predict --ckpt_path last`` rebuilds the model."""
    root = tmp_path / "run"
    common = ["--config", str(RECIPE), "--data.init_args.data_dir", str(ecg_folder), "--model.backbone", "tiny",
              "--trainer.default_root_dir", str(root), *FAST]
    assert "examples.ecg" not in sys.modules
    assert main(["fit", *common, "--trainer.max_epochs", "1", "--trainer.log_every_n_steps", "1"]) == 0
    err = capsys.readouterr().err
    assert "mmte: error" not in err
    ckpt = torch.load(root / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    hp = ckpt["hyper_parameters"]
    assert hp["tokenizers"]["ecg"] == {"name": "examples.ecg.ECGTokenizer", "patch": 25}
    assert hp["heads"]["beat"] == {"name": "examples.ecg.AttentionPoolHead", "dropout": 0.1}
    assert ckpt["state_dict"]["model.heads.beat.score.weight"].shape == (1, 64)
    with open(next(root.glob("logs/version_*/metrics.csv"))) as fh:
        cols = next(csv.reader(fh))
    assert "val_acc" in cols  # the subclass of ClassificationHead gets accuracy (its task)

    out = tmp_path / "pred.csv"
    assert main(["predict", *common, "--ckpt_path", "last", "--prediction_writer.output", str(out)]) == 0
    with open(out) as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(r["target"] for r in rows) == ["normal", "normal", "wide", "wide"], rows  # the stratified validation split
    assert {r["pred"] for r in rows} <= {"normal", "wide"}, rows
    assert all(0.5 <= float(r["prob"]) <= 1.0 and r["id"].endswith(".npy") for r in rows), rows


def test_unknown_modality_names_the_closest_and_the_doc(ecg, ecg_folder, tmp_path, capsys):
    rc = main(["fit", "--config", str(RECIPE), "--data.init_args.data_dir", str(ecg_folder), "--model.backbone", "tiny",
               "--model.tokenizers", "{ecg: {name: ecgg}}", "--trainer.default_root_dir", str(tmp_path / "r"), *FAST])
    assert rc == 2
    known = ", ".join(registry.list_modalities())
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"mmte: error: unknown modality 'ecgg', expected one of {known} (did you mean 'ecg'?), "
        "see mmte list modalities (to add one: docs/extending.md)")


def test_a_class_path_typo_names_the_module_and_the_closest_class(on_path):
    with pytest.raises(ValueError) as e:
        registry.get_modality("examples.ecg.ECGTokeniser")
    assert str(e.value) == ("examples.ecg.ECGTokeniser: module examples.ecg has no 'ECGTokeniser', expected one of AttentionPoolHead, "
                            f"ECGTokenizer (did you mean 'ECGTokenizer'?), fix the class path (defined in {EXAMPLE})")
    with pytest.raises(ValueError) as e:
        registry.get_modality("examples.no_such_module.Tok")
    assert str(e.value).startswith("unknown modality 'examples.no_such_module.Tok', expected one of audio, ")


# ------------------------------------------------------------------------------------ 3. entry point
def test_entry_point_route(on_path, tmp_path, monkeypatch, capsys):
    site = tmp_path / "site"
    shutil.copytree(FIXTURE, site)
    monkeypatch.syspath_prepend(str(site))
    try:
        assert "ecg" in registry.reload()
        HEADS.reload_entry_points()
        assert registry.get_modality("ecg").tokenizer.__module__ == "examples.ecg"
        assert HEADS.get("attention_pool").__module__ == "examples.ecg"
        assert main(["list", "modalities", "heads"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert "  ecg            ECGTokenizer, default head attention_pool: Single-lead ECG [B, L] -> one token per ``patch`` samples, plus learned positions" in out
        assert any(re.fullmatch(r"  attention_pool +AttentionPoolHead \(classification\): Classification over a learned softmax-weighted average "
                                r"of the tokens \(padding excluded\)", ln) for ln in out), out
        # plain names, no class paths; the head defaults to the modality's (attention_pool)
        from mmte import MetaTransformer

        model = MetaTransformer({"ecg": "ecg"}, "tiny", {"beat": {"num_classes": 2}}, freeze="none")
        assert type(model.heads["beat"]).__name__ == "AttentionPoolHead"
        assert model({"ecg": torch.randn(2, 1000)})["beat"].shape == (2, 2)
    finally:
        _forget_example()
        monkeypatch.undo()
        registry.reload()
        HEADS.reload_entry_points()
