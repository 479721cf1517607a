"""The Lightning FP8 precision plugin: YAML fragments parse through LightningCLI, a short fit runs FP8."""

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from mmte import fp8
from mmte.encoders import Backbone
from mmte.training.precision import FP8Precision

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "precision"


class TinyFP8Module(pl.LightningModule):
    """A token classifier on random data whose backbone is converted in configure_model."""

    def __init__(self, hidden: int = 64):
        super().__init__()
        self.hidden = hidden
        self.model = None

    def configure_model(self):
        if self.model is not None:
            return
        self.model = torch.nn.ModuleDict({"stem": torch.nn.Linear(8, self.hidden), "backbone": Backbone("tiny"), "head": torch.nn.Linear(self.hidden, 3)})
        plugin = self.trainer.precision_plugin
        if hasattr(plugin, "fp8_convert"):
            plugin.fp8_convert(self)

    def training_step(self, batch, _):
        x, y = batch
        assert fp8.is_fp8_enabled()  # the plugin's forward context is active
        h = self.model["backbone"](self.model["stem"](x))
        loss = torch.nn.functional.cross_entropy(self.model["head"](h.mean(1)), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def _loader():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 13, 8, generator=g)  # 13 tokens: padded inside the FP8 GEMMs
    y = torch.randint(0, 3, (32,), generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


@pytest.mark.parametrize("name", ["fp8-delayed", "fp8-current", "fp8-block", "fp8-mx"])
def test_yaml_fragment_selects_the_plugin(name, tmp_path, monkeypatch):
    import sys

    from lightning.pytorch.cli import LightningCLI

    monkeypatch.setattr(sys, "argv", ["mmte"])

    cli = LightningCLI(
        TinyFP8Module,
        run=False,
        args=["--config", str(CONFIGS / f"{name}.yaml"), "--trainer.accelerator=cpu", f"--trainer.default_root_dir={tmp_path}"],
        save_config_kwargs={"overwrite": True},
    )
    plugin = cli.trainer.precision_plugin
    assert isinstance(plugin, FP8Precision)
    want = {"fp8-delayed": fp8.DelayedScaling, "fp8-current": fp8.CurrentScaling, "fp8-block": fp8.BlockScaling, "fp8-mx": fp8.MXFP8}[name]
    assert type(plugin.recipe) is want and plugin.recipe.fp8_format is fp8.Format.HYBRID
    assert plugin.autocast_dtype is torch.bfloat16


def test_fit_runs_fp8_and_records_scaling_state(tmp_path):
    plugin = FP8Precision("delayed", recipe_args={"amax_history_len": 4}, autocast_dtype=None, device="cpu")
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=6, plugins=[plugin], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )
    module = TinyFP8Module()
    trainer.fit(module, _loader())
    fc1 = module.model["backbone"].layers["1"].layernorm_mlp.fc1
    assert isinstance(fc1, fp8.FP8Linear) and not isinstance(module.model["stem"], fp8.FP8Linear)
    assert (fc1.fp8_amax_history[:, :3] > 0).all()  # forward and gradient amaxes of earlier steps
    assert torch.isfinite(trainer.callback_metrics["loss"])
    ckpt = module.state_dict()
    assert "model.backbone.layers.1.layernorm_mlp.fc1.fp8_amax_history" in ckpt


def test_forward_context_composes_bf16_and_fp8():
    plugin = FP8Precision("current", autocast_dtype="bfloat16", device="cpu")
    with plugin.forward_context():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") is torch.bfloat16
        assert isinstance(fp8.get_fp8_context().recipe, fp8.CurrentScaling)
    assert not fp8.is_fp8_enabled()
    m = torch.nn.Sequential(Backbone("tiny"))
    assert plugin.convert_module(m) is m and plugin.convert_module(m) is m
    assert sum(isinstance(x, fp8.FP8Linear) for x in m.modules()) == 8


def test_bad_arguments_and_missing_capability():
    with pytest.raises(ValueError, match="autocast_dtype must be one of"):
        FP8Precision(autocast_dtype="float8")
    with pytest.raises(ValueError, match="recipe must be one of"):
        FP8Precision("nvfp4")
    with pytest.raises(ValueError, match="recipe_args only apply"):
        FP8Precision(fp8.MXFP8(), recipe_args={"block_size": 16})
    with pytest.raises(RuntimeError, match=r"MXFP8\) cannot run on cpu: .*capability >= 10.0"):
        FP8Precision("mx", recipe_args={"gemm": "scaled_mm"}).check_device("cpu")
