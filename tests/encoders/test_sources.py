"""Pretrained backbone sources resolved offline from a FAKE Hugging Face hub cache made here.

Each test builds a tiny model (timm's ``test_vit``, a 2-layer BERT, a 2-layer OpenCLIP ViT), writes its
weights in the hub cache layout (``models--org--name/snapshots/<commit>/<file>`` + ``refs/main``) under a
temporary ``HF_HUB_CACHE`` with ``HF_HUB_OFFLINE=1``, and checks that the resolved mmte backbone holds
exactly the library's weights and computes what the library's own blocks compute. Nothing is downloaded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from mmte.encoders import BackboneConfig, from_hf, from_timm, sources
from mmte.encoders.sources import hub_cache_dir, resolve_backbone_source, source_config

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    """An empty hub cache as the process's cache, offline; in-memory source caches cleared."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", os.fspath(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    sources.clear_cache()
    yield cache
    sources.clear_cache()


def _snapshot(cache: Path, repo: str) -> Path:
    """The snapshot folder of ``repo`` in the hub cache layout, with refs/main pointing at it."""
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(COMMIT)
    snap = root / "snapshots" / COMMIT
    snap.mkdir(parents=True, exist_ok=True)
    return snap


def _assert_same_state(backbone, ref_state) -> None:
    """The backbone's pretrained tensors equal ``ref_state`` exactly (LoRA adapters, which are not
    pretrained, left aside)."""
    own = {k: v for k, v in backbone.state_dict().items() if ".lora." not in k}
    assert set(own) == set(ref_state)
    for k, v in ref_state.items():
        torch.testing.assert_close(own[k], v, rtol=0, atol=0)


def test_hub_cache_dir_follows_huggingface_rule(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", os.fspath(tmp_path / "home"))
    assert hub_cache_dir() == os.fspath(tmp_path / "home" / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", os.fspath(tmp_path / "c"))
    assert hub_cache_dir() == os.fspath(tmp_path / "c")


def test_timm_source_from_cache(hub):
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    torch.manual_seed(1)
    ref = timm.create_model("test_vit", pretrained=False).eval()
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, os.fspath(_snapshot(hub, "timm/test_vit.r160_in1k") / "model.safetensors"))

    b = resolve_backbone_source("timm:test_vit.r160_in1k")
    _assert_same_state(b, from_timm(ref).backbone.state_dict())
    # independent check: mmte's backbone on tokens == timm's own blocks + final norm
    x = torch.randn(2, 11, ref.embed_dim)
    torch.testing.assert_close(b.eval()(x), ref.norm(ref.blocks(x)), rtol=1.3e-6, atol=1e-5)
    assert source_config("timm:test_vit.r160_in1k") == b.config
    assert b.config.num_layers == len(ref.blocks) and b.config.hidden_size == ref.embed_dim


def test_timm_source_not_cached_names_the_cache(hub):
    pytest.importorskip("timm")
    folder = os.path.join(os.fspath(hub), "models--timm--test_vit.r160_in1k")
    msg = (
        f"backbone_weights 'timm:test_vit.r160_in1k': none of ['model.safetensors', 'pytorch_model.bin'] of 'timm/test_vit.r160_in1k' "
        f"is not in the Hugging Face cache {folder} and HF_HUB_OFFLINE=1 forbids downloading it; run `hf download timm/test_vit.r160_in1k` "
        "once where there is network (or set HF_HOME / HF_HUB_CACHE to the cache that has it)"
    )
    with pytest.raises(ValueError) as e:
        resolve_backbone_source("timm:test_vit.r160_in1k")
    assert str(e.value) == msg
    with pytest.raises(ValueError, match=r"timm has no pretrained model 'no_such_vit'"):
        resolve_backbone_source("timm:no_such_vit")


def test_hf_hub_id_from_cache(hub):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                  max_position_embeddings=16)
    torch.manual_seed(2)
    ref = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    ref.save_pretrained(_snapshot(hub, "mmte-test/tiny-bert"))

    b = resolve_backbone_source("hf:mmte-test/tiny-bert")
    _assert_same_state(b, from_hf(ref).backbone.state_dict())
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(b.eval()(x), ref.encoder(x).last_hidden_state, rtol=1.3e-6, atol=1e-5)

    with pytest.raises(ValueError) as e:
        resolve_backbone_source("hf:mmte-test/absent")
    assert str(e.value).startswith(
        f"backbone_weights 'hf:mmte-test/absent': the model of 'mmte-test/absent' is not in the Hugging Face cache "
        f"{os.path.join(os.fspath(hub), 'models--mmte-test--absent')} and HF_HUB_OFFLINE=1 forbids downloading it"
    )
    with pytest.raises(ValueError, match=r"'a/b/c' is neither a local Hugging Face model folder nor a hub id 'org/name'"):
        resolve_backbone_source("hf:a/b/c")


def test_bert_folder_is_read_without_building_the_hf_model(tmp_path, caplog, monkeypatch):
    """A BERT folder with model.safetensors is read straight from the file (no transformers model or config
    built); a .bin folder goes through transformers, and a masked-LM checkpoint (``bert.`` keys) is read
    straight too: each gives the same trunk as from_hf."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                  max_position_embeddings=16, hidden_act="gelu_new")
    torch.manual_seed(3)
    ref = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    want = from_hf(ref).backbone.state_dict()
    ref.save_pretrained(tmp_path / "st")
    ref.config.save_pretrained(tmp_path / "bin")  # pytorch_model.bin weights: transformers reads them
    torch.save(ref.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    mlm = transformers.BertForMaskedLM(cfg).eval()
    mlm.bert.load_state_dict(ref.state_dict(), strict=False)
    mlm.save_pretrained(tmp_path / "mlm")
    sources.clear_cache()

    caplog.set_level("INFO", logger="mmte")
    b = resolve_backbone_source(f"hf:{tmp_path / 'bin'}")
    assert "read BERT trunk from" not in caplog.text
    _assert_same_state(b, want)

    def refuse(*args, **kwargs):
        raise AssertionError("a transformers model or config was built")

    for cls in (transformers.AutoConfig, transformers.BertModel, transformers.BertForMaskedLM):
        monkeypatch.setattr(cls, "from_pretrained", refuse)
    for folder in ("st", "mlm"):
        caplog.clear()
        fast = resolve_backbone_source(f"hf:{tmp_path / folder}")
        assert f"read BERT trunk from {tmp_path / folder / 'model.safetensors'}" in caplog.text, folder
        _assert_same_state(fast, want)
        x = torch.randn(2, 5, 32)
        torch.testing.assert_close(fast.eval()(x), ref.encoder(x).last_hidden_state, rtol=1.3e-6, atol=1e-5)
    sources.clear_cache()


def test_a_source_is_read_once_until_clear_cache(tmp_path):
    """resolve_backbone_source reads a folder once per process: saved again, it still gives the first weights,
    and after sources.clear_cache() the new ones."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                                  max_position_embeddings=16)
    folder = tmp_path / "bert"

    def save(seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        ref = transformers.BertModel(cfg, add_pooling_layer=False)
        ref.save_pretrained(folder)
        return from_hf(ref).backbone.state_dict()

    first = save(4)
    _assert_same_state(resolve_backbone_source(f"hf:{folder}"), first)
    second = save(5)
    _assert_same_state(resolve_backbone_source(f"hf:{folder}"), first)
    sources.clear_cache()
    _assert_same_state(resolve_backbone_source(f"hf:{folder}"), second)


def test_open_clip_source_from_cache(hub, tmp_path, monkeypatch):
    open_clip = pytest.importorskip("open_clip", reason="open_clip_torch is not installed (pip install 'mmte[open_clip]')")
    from safetensors.torch import save_file

    from mmte.encoders import open_clip_to_mmte

    arch = "mmte-tiny-vit"
    (tmp_path / "oc").mkdir()
    (tmp_path / "oc" / f"{arch}.json").write_text(json.dumps({
        "embed_dim": 32,
        "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 32, "patch_size": 16},
        "text_cfg": {"context_length": 8, "vocab_size": 64, "width": 32, "heads": 2, "layers": 1},
    }))
    open_clip.add_model_config(tmp_path / "oc")
    monkeypatch.setitem(open_clip.pretrained._PRETRAINED, arch, {"fake": {"hf_hub": "mmte-test/tiny-clip/", "quick_gelu": True}})
    torch.manual_seed(3)
    ref = open_clip.create_model(arch, force_quick_gelu=True).eval()
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, os.fspath(_snapshot(hub, "mmte-test/tiny-clip") / "open_clip_model.safetensors"))

    b = resolve_backbone_source(f"open_clip:{arch}/fake")
    assert b.config.activation == "quick_gelu" and b.config.num_attention_heads == 2 and b.config.num_layers == 2
    _assert_same_state(b, open_clip_to_mmte(ref.visual.state_dict(), num_heads=2, activation="quick_gelu").backbone.state_dict())
    # independent check: OpenCLIP's own tower (ln_pre -> resblocks -> ln_post) on the same tokens
    x = torch.randn(2, 5, 64)
    v = ref.visual
    torch.testing.assert_close(b.eval()(x), v.ln_post(v.transformer(v.ln_pre(x))), rtol=1.3e-6, atol=1e-5)
    with pytest.raises(ValueError, match=r"OpenCLIP has no weights 'mmte-tiny-vit'/'other'; tags for 'mmte-tiny-vit': \['fake'\]"):
        resolve_backbone_source(f"open_clip:{arch}/other")


def test_converted_file_carries_its_config(tmp_path, capsys):
    """`mmte convert` writes the BackboneConfig into the file; the model needs no preset, and a
    preset that disagrees is an error naming both."""
    timm = pytest.importorskip("timm")
    from mmte.cli import main
    from mmte.training.module import MMTEModule

    torch.manual_seed(4)
    ref = timm.create_model("test_vit", pretrained=False)
    torch.save(ref.state_dict(), tmp_path / "w.pth")
    out = tmp_path / "test_vit.safetensors"
    assert main(["convert", "--from", "timm", "test_vit", "--checkpoint", os.fspath(tmp_path / "w.pth"), "--out", os.fspath(out)]) == 0
    cfg = source_config(out)
    assert isinstance(cfg, BackboneConfig) and cfg == from_timm(ref).backbone.config
    toks = {"image": {"name": "image", "img_size": 8, "patch_size": 4, "in_chans": 1}}
    m = MMTEModule(toks, None, {"d": {"name": "classification"}}, backbone_weights=os.fspath(out), data_info={"num_classes": 3})
    m.configure_model()
    _assert_same_state(m.model.backbone, from_timm(ref).backbone.state_dict())
    with pytest.raises(ValueError) as e:
        MMTEModule(toks, "tiny", {"d": {"name": "classification"}}, backbone_weights=os.fspath(out), data_info={"num_classes": 3})
    assert str(e.value).startswith(f"model.backbone 'tiny' is {BackboneConfig(2, 64, 4, 128)} but backbone_weights {os.fspath(out)!r} is {cfg}")


def test_fit_with_a_cached_timm_backbone_through_the_cli(hub, tmp_path):
    """What a user runs: the quickstart recipe with its backbone swapped for a cached timm model,
    no preset given (the source fixes the shape); the frozen backbone is left out of the checkpoint
    and rebuilt from the source on load."""
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    from mmte.cli import MMTECLI
    from mmte.training.module import MMTEModule

    torch.manual_seed(5)
    ref = timm.create_model("test_vit", pretrained=False)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, os.fspath(_snapshot(hub, "timm/test_vit.r160_in1k") / "model.safetensors"))
    root = Path(__file__).resolve().parents[2]
    cli = MMTECLI(args=[
        "fit", "--config", os.fspath(root / "recipes" / "quickstart.yaml"),
        "--model.backbone", "null", "--model.backbone_weights", "timm:test_vit.r160_in1k",
        "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", os.fspath(tmp_path / "run"),
    ])
    assert cli.trainer.global_step == 2
    assert cli.model.model.backbone.config == from_timm(ref).backbone.config
    _assert_same_state(cli.model.model.backbone, from_timm(ref).backbone.state_dict())  # frozen: unchanged by training
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["mmte"]["frozen"]["source"] == "timm:test_vit.r160_in1k"
    assert not any(k.startswith("model.backbone.") for k in ckpt["state_dict"])
    loaded = MMTEModule.load_from_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt", strict=True)
    _assert_same_state(loaded.model.backbone, from_timm(ref).backbone.state_dict())
