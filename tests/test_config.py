"""Typed configs (mmte/config.py): LoRA and optimisation dataclasses, head and tokenizer entries checked
against their registered classes, and the typed config's round trip through a checkpoint."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from jsonargparse import ArgumentParser

from mmte import config
from mmte.config import (
    LoRAConfig,
    OptimConfig,
    check_head_entry,
    check_tokenizer_entry,
    entry_dict,
    head_config,
    tokenizer_config,
)
from mmte.errors import UsageError
from mmte.heads import ClassificationHead, register_head
from mmte.heads.registry import HEADS

IMG = {"name": "image", "img_size": 8, "patch_size": 4, "in_chans": 1}


# ------------------------------------------------------------------------------------- LoRA
def test_lora_config_from_a_recipe_mapping_and_back():
    cfg = LoRAConfig.from_value({"rank": 4, "alpha": 8})
    assert cfg == LoRAConfig(rank=4, alpha=8)
    assert cfg.as_dict() == {"rank": 4, "alpha": 8, "dropout": 0.0, "lr_scale": 1.0, "targets": None}
    assert LoRAConfig.from_value(cfg.as_dict()) == cfg
    assert LoRAConfig.from_value(None) is None and LoRAConfig.from_value({}) is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"rnk": 4}, ("unknown model.lora option(s) ['rnk'], expected some of ['rank', 'alpha', 'dropout', 'lr_scale', 'targets'] "
                     "(did you mean 'rank'?), fix or drop them")),
        ({"rank": 0}, "LoRA rank must be a positive int; got 0"),
        ({"dropout": 1.5}, "model.lora.dropout is 1.5, expected a number in [0, 1), set e.g. dropout: 0.0"),
        ({"targets": "layers.*"}, ("model.lora.targets is 'layers.*', expected a list of globs over the backbone's Linear names, "
                                  "write e.g. targets: ['layers.*.self_attention.layernorm_qkv.linear']")),
    ],
)
def test_lora_config_refuses_in_one_line(value, message):
    with pytest.raises(ValueError) as e:
        LoRAConfig.from_value(value)
    assert str(e.value) == message


def test_the_parser_types_model_lora():
    """jsonargparse reads the dataclass: options merge with ``--a.lora.rank``, a wrong type or unknown option
    is the parser's error."""
    p = ArgumentParser(exit_on_error=False)
    p.add_argument("--lora", type=LoRAConfig | None, default=None)
    ns = p.parse_args(["--lora", "{rank: 4}", "--lora.alpha", "2"])
    assert p.instantiate_classes(ns).lora == LoRAConfig(rank=4, alpha=2.0)
    with pytest.raises(Exception, match="rank"):
        p.parse_args(["--lora", "{rank: four}"])
    with pytest.raises(Exception, match="rnk"):
        p.parse_args(["--lora", "{rnk: 4}"])


# ---------------------------------------------------------------------------------- optimisation
def test_optim_config_validates_and_serialises():
    assert OptimConfig(lr=3e-4, betas=[0.9, 0.95]).as_dict()["betas"] == (0.9, 0.95)
    with pytest.raises(ValueError, match=r"layer_decay must be in \(0, 1\] or None; got 1.5"):
        OptimConfig(layer_decay=1.5)
    with pytest.raises(ValueError, match="mixup must be a number >= 0"):
        OptimConfig(mixup=-1)


# ---------------------------------------------------------------------------------- entries
def test_head_config_is_derived_from_the_registered_class():
    fields = {f.name: f.default for f in dataclasses.fields(head_config("classification"))}
    assert fields["name"] == "classification" and fields["pool"] == "mean" and fields["weight"] == 1.0
    assert {"num_classes", "hidden", "dropout", "label_smoothing", "inputs", "target"} <= set(fields)
    assert "patch_size" in {f.name for f in dataclasses.fields(tokenizer_config("image"))}


def test_head_entry_unknown_option_and_wrong_type():
    check_head_entry("digit", {"name": "classification", "pool": "cls", "dropout": 0.1, "inputs": "image", "weight": 2.0})
    check_head_entry("fc", {"name": "forecasting", "num_patches": "auto", "dropout": 0.3})  # filled from the data
    with pytest.raises(UsageError) as e:
        check_head_entry("digit", {"name": "classification", "dropuot": 0.1})
    assert str(e.value) == ("unknown model.heads.digit (classification) option(s) ['dropuot'], expected some of ['dropout', 'hidden', "
                            "'label_smoothing', 'norm', 'num_classes', 'pool'] (did you mean 'dropout'?), fix or drop them")
    with pytest.raises(UsageError) as e:
        check_head_entry("digit", {"name": "classification", "dropout": "abc"})
    assert str(e.value) == "model.heads.digit (classification) option dropout is 'abc' (a str), expected a number, no quotes: a quoted number is a string"


def test_tokenizer_entry_unknown_option_and_wrong_type():
    check_tokenizer_entry("image", IMG)
    check_tokenizer_entry("image", "image")
    with pytest.raises(UsageError, match=r"unknown image tokenizer option\(s\) \['patch'\]"):
        check_tokenizer_entry("image", {**IMG, "patch": 4})
    with pytest.raises(UsageError, match="image tokenizer option patch_size is '4'"):
        check_tokenizer_entry("image", {**IMG, "patch_size": "4"})


def test_a_head_registered_later_gets_a_config():
    @register_head("test_config_head")
    class _Head(ClassificationHead):
        def __init__(self, dim: int, num_classes: int, temperature: float = 1.0):
            super().__init__(dim, num_classes)

    try:
        assert "temperature" in {f.name for f in dataclasses.fields(head_config("test_config_head"))}
        with pytest.raises(UsageError, match="option temperature is 'hot'"):
            check_head_entry("h", {"name": "test_config_head", "temperature": "hot"})
    finally:
        HEADS.unregister("test_config_head")


def test_a_head_forwarding_kwargs_takes_its_parents_options():
    """``__init__(self, dim, num_classes, **kwargs)`` passing them to ClassificationHead takes its options."""
    @register_head("test_config_forwarding")
    class _Head(ClassificationHead):
        def __init__(self, dim: int, num_classes: int, **kwargs):
            super().__init__(dim, num_classes, **kwargs)

    try:
        check_head_entry("h", {"name": "test_config_forwarding", "dropout": 0.1})
        with pytest.raises(UsageError, match="option dropout is 'x'"):
            check_head_entry("h", {"name": "test_config_forwarding", "dropout": "x"})
    finally:
        HEADS.unregister("test_config_forwarding")


# ---------------------------------------------------------------------------------- parser entry types
def _entry_parser():
    p = ArgumentParser(exit_on_error=False)
    p.add_argument("--heads", type=dict[str, config.HeadEntry] | None, default=None)
    p.add_argument("--tokenizers", type=dict[str, config.TokenizerEntry | str] | None, default=None)
    return p


def test_the_parser_types_head_and_tokenizer_entries():
    """Every registered head's options, typed: a flag merges into the recipe's entry, an option no head has or a
    wrong type is the parser's error; unset options are None and dropped by entry_dict."""
    p = _entry_parser()
    ns = p.parse_args(["--heads", "{digit: {name: classification, pool: cls}}", "--heads.digit.dropout", "0.1",
                       "--tokenizers", "{image: {name: image, patch_size: 4}, audio: audio}", "--tokenizers.image.in_chans", "1"])
    assert entry_dict(ns.heads["digit"]) == {"name": "classification", "pool": "cls", "dropout": 0.1}
    assert entry_dict(ns.tokenizers["image"]) == {"name": "image", "patch_size": 4, "in_chans": 1}
    assert ns.tokenizers["audio"] == "audio"
    assert entry_dict(p.parse_args(["--heads", "{f: {name: forecasting, num_patches: auto}}"]).heads["f"]) == {
        "name": "forecasting", "num_patches": "auto"}
    with pytest.raises(Exception, match="dropuot"):
        p.parse_args(["--heads", "{digit: {name: classification}}", "--heads.digit.dropuot", "0.1"])
    with pytest.raises(Exception, match="dropout"):
        p.parse_args(["--heads", "{digit: {name: classification}}", "--heads.digit.dropout", "abc"])


def test_entry_types_follow_the_registry():
    """A head registered later adds its options once the types are rebuilt; the same registry keeps the same types."""
    before = config.refresh_entry_types()
    assert config.refresh_entry_types() == before  # unchanged registry: the types a parser holds stay valid

    @register_head("test_config_entry_head")
    class _Head(ClassificationHead):
        def __init__(self, dim: int, num_classes: int, temperature: float = 1.0):
            super().__init__(dim, num_classes)

    try:
        head_entry, _ = config.refresh_entry_types()
        assert {f.name: f.type for f in dataclasses.fields(head_entry)}["temperature"] == float | None
    finally:
        HEADS.unregister("test_config_entry_head")
        config.refresh_entry_types()
    assert "temperature" not in {f.name for f in dataclasses.fields(config.HeadEntry)}


# ---------------------------------------------------------------------------------- module
def test_module_refuses_a_bad_head_option_before_building():
    from mmte.training.module import MMTEModule

    with pytest.raises(UsageError, match=r"unknown model.heads.digit \(classification\) option\(s\) \['dropuot'\]"):
        MMTEModule({"image": IMG}, "tiny", {"digit": {"name": "classification", "dropuot": 0.1}}, data_info={"num_classes": 3})


def test_typed_config_round_trip_through_a_checkpoint(tmp_path):
    """The checkpoint stores the typed configs as plain data (loadable with weights_only) and the module
    rebuilt from them is the same model."""
    from mmte.training.module import MMTEModule

    m = MMTEModule({"image": IMG}, "tiny", {"digit": {"name": "classification", "pool": "cls"}}, lora=LoRAConfig(rank=2),
                   lr=3e-4, data_info={"num_classes": 3})
    assert m.optim.lr == 3e-4 and m.lora == LoRAConfig(rank=2)
    path = tmp_path / "m.ckpt"
    torch.save({"hyper_parameters": dict(m.hparams)}, path)
    hp = torch.load(path, weights_only=True)["hyper_parameters"]
    assert hp["lora"] == {"rank": 2, "alpha": 16.0, "dropout": 0.0, "lr_scale": 1.0, "targets": None}
    again = MMTEModule(**hp)
    assert again.lora == m.lora and again.optim == m.optim
    assert again.head_cfg == m.head_cfg and again.tokenizer_cfg == m.tokenizer_cfg
    built = []
    for module in (m, again):
        with torch.device("meta"):  # shapes only: nothing allocated
            module.configure_model()
        built.append({k: v.shape for k, v in module.model.state_dict().items()})
    assert built[0] == built[1]


def test_module_stores_typed_entries_as_plain_data():
    """Entries the parser typed (HeadEntry / TokenizerEntry) are stored without their unset options."""
    from mmte.training.module import MMTEModule

    m = MMTEModule({"image": config.TokenizerEntry(name="image", img_size=8, patch_size=4, in_chans=1)}, "tiny",
                   {"digit": config.HeadEntry(name="classification", dropout=0.1)}, data_info={"num_classes": 3})
    assert m.hparams["heads"] == {"digit": {"name": "classification", "dropout": 0.1}}
    assert m.hparams["tokenizers"] == {"image": IMG}
