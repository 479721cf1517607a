"""Every recipe under recipes/ parses and instantiates with LightningCLI(run=False); the quick ones fit a
few steps (tiny backbone fragment stacked where the recipe's own backbone is slow on a CPU)."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
import torch

from tests.recipe_data import recipe_data_args

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
FSDD_RECIPES = {"fsdd_audio", "fsdd_speakers", "audio_image_joint", "audio_image_retrieval"}


def _cli(args, tmp_path):
    from mmte.cli import MMTECLI

    return MMTECLI(args=[*args, "--trainer.default_root_dir", str(tmp_path / "run")], run=False)


def test_there_are_recipes():
    names = {p.stem for p in RECIPES}
    assert {"quickstart", "fsdd_audio", "fsdd_speakers", "etth1_forecast", "tabular_wine", "diamonds_tabular", "audio_image_joint",
            "audio_image_retrieval"} <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_parses_and_instantiates(recipe, tmp_path):
    cli = _cli(["--config", str(recipe), *recipe_data_args(recipe.stem)], tmp_path)
    from mmte.training.data import MMTEDataModule
    from mmte.training.module import MMTEModule

    assert isinstance(cli.model, MMTEModule)
    assert isinstance(cli.datamodule, MMTEDataModule)
    # what the data determines reached the model's heads
    for cfg in cli.model.head_cfg.values():
        if cfg["name"] == "classification":
            assert cfg["num_classes"] == len(cli.datamodule.class_names)
        if cfg["name"] == "forecasting":
            assert cfg["horizon"] == cli.datamodule.horizon and isinstance(cfg["num_patches"], int)
    assert cli.trainer.max_epochs >= 1


def _metrics(root: Path) -> dict[str, float]:
    with open(next(root.glob("run/logs/version_*/metrics.csv"))) as fh:
        rows = list(csv.DictReader(fh))
    last: dict[str, float] = {}
    for r in rows:
        for k, v in r.items():
            if v not in ("", None):
                last[k] = float(v)
    return last


QUICK = ["quickstart", "fsdd_audio", "fsdd_speakers", "etth1_forecast", "tabular_wine", "diamonds_tabular", "audio_image_joint", "audio_image_retrieval"]


@pytest.mark.parametrize("name", QUICK)
def test_quick_recipe_fits_a_few_steps(name, tmp_path):
    """Each recipe trains 3 steps and validates 2 batches; the tiny backbone fragment keeps it quick,
    except the quickstart, which runs its real frozen MiniLM trunk."""
    from mmte.cli import MMTECLI

    args = ["fit", "--config", str(ROOT / "recipes" / f"{name}.yaml")]
    if name != "quickstart":
        args += ["--config", str(ROOT / "configs" / "encoders" / "tiny.yaml")]
    args += recipe_data_args(name)
    args += ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2", "--trainer.enable_progress_bar", "false",
             "--trainer.default_root_dir", str(tmp_path / "run")]
    torch.manual_seed(0)
    cli = MMTECLI(args=args)
    assert cli.trainer.global_step == 3
    m = _metrics(tmp_path)
    assert "val_loss" in m and torch.isfinite(torch.tensor(m["val_loss"]))
    primary, _ = cli.model.primary_metric
    assert primary in m, f"{primary} not logged; got {sorted(m)}"
    assert os.path.isfile(tmp_path / "run" / "checkpoints" / "last.ckpt")


FRAGMENTS = sorted(p for d in ("models", "tokenizers", "encoders", "heads", "data") for p in (ROOT / "configs" / d).glob("*.yaml"))


@pytest.mark.parametrize("fragment", FRAGMENTS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_fragment_stacks_onto_a_recipe(fragment, tmp_path):
    """Each fragment under configs/ stacks onto a recipe it fits, and its values win."""
    import yaml

    recipe = "fsdd_audio" if "audio" in fragment.stem else "quickstart"
    data_args, own = recipe_data_args(recipe), set()
    if fragment.stem.startswith("hf-"):  # a Hugging Face dataset instead of the recipe's folder: a small one built here
        from tests.training.hf_fixtures import fsdd_subset, save_fsdd

        recipe, own = "fsdd_speakers", {"path"}
        data_args = ["--data.init_args.path", str(save_fsdd(fsdd_subset(tmp_path / "wavs", ("george", "theo"), range(2)), tmp_path / "hf"))]
    cli = _cli(["--config", str(ROOT / "recipes" / f"{recipe}.yaml"), "--config", str(fragment), *data_args], tmp_path)
    want = yaml.safe_load(fragment.read_text())
    for key, value in (want.get("model") or {}).items():
        got = cli.model.hparams[key] if key not in ("tokenizers", "heads", "backbone") else {
            "tokenizers": cli.model.tokenizer_cfg, "heads": cli.model.head_cfg, "backbone": cli.model.backbone_spec}[key]
        if isinstance(value, dict):
            for k, v in value.items():
                sub = got[k]
                assert all(sub[kk] == vv for kk, vv in v.items()) if isinstance(v, dict) else sub == v, (key, k)
        else:
            assert got == value, (key, got, value)
    for key, value in ((want.get("data") or {}).get("init_args") or {}).items():
        assert key in own or getattr(cli.datamodule, key) == value
    for key, value in (want.get("trainer") or {}).items():
        if key == "max_epochs":
            assert cli.trainer.max_epochs == value
