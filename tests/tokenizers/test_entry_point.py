"""A third-party modality installed as a distribution (entry-point group ``mmte.modalities``)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

import mmte
from mmte.tokenizers import registry

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "mmte_signal_plugin"


@pytest.fixture
def plugin_on_path(tmp_path, monkeypatch):
    before = mmte.list_modalities()  # entry points scanned without the plug-in
    assert "signal1d" not in before
    site = tmp_path / "site"
    shutil.copytree(FIXTURE, site)
    monkeypatch.syspath_prepend(str(site))
    yield site
    for name in ("signal1d", "signal_bare"):
        registry.MODALITIES.unregister(name)
    sys.modules.pop("mmte_signal_plugin", None)
    monkeypatch.undo()
    registry.reload()


def test_plugin_appears_and_trains(plugin_on_path):
    assert "signal1d" not in mmte.list_modalities()  # installed, not yet rescanned
    names = registry.reload()
    assert "signal1d" in names and "signal_bare" in names
    assert "signal1d" in mmte.list_modalities()
    spec = mmte.get_modality("signal1d")
    assert spec.tokenizer.__module__ == "mmte_signal_plugin" and spec.variable_length
    bare = mmte.tokenizers.create("signal_bare", dim=16, width=3)
    assert bare(torch.zeros(2, 5, 3)).tokens.shape == (2, 5, 16)

    torch.manual_seed(0)
    model = mmte.MetaTransformer({"signal1d": "signal1d"}, "tiny", {"kind": {"name": "classification", "num_classes": 2}})
    trainable = model.trainable_parameter_names()
    assert trainable and all(n.startswith(("tokenizers.signal1d.", "heads.kind.")) for n in trainable)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)

    def batch(seeds, size):
        return {
            "signal1d": spec.collate_fn([spec.example(size, s) for s in seeds]),
            "label": torch.tensor([s % 2 for s in seeds]),
        }

    for step in range(40):
        b = batch(range(step * 16, step * 16 + 16), step % 2)
        loss = model.loss(model(b), b)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    test = batch(range(5000, 5064), 1)
    with torch.no_grad():
        acc = (model(test)["kind"].argmax(-1) == test["label"]).float().mean().item()
    assert acc >= 0.9, f"plug-in modality did not learn sine vs square: accuracy {acc:.2f}"


def test_broken_plugin_is_skipped(tmp_path, monkeypatch, caplog):
    dist = tmp_path / "broken-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[mmte.modalities]\nbroken = no_such_module_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    names = registry.reload()
    assert "broken" not in names and "audio" in names
    assert any("no_such_module_xyz" in r.getMessage() or "broken" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    registry.reload()
