"""``model.ema_decay``: the weight average on the ETTh1 recipe through ``mmte fit`` (the real CLI class,
MMTEModule and MetaTransformer), against a naive average kept by a callback from the live weights after
every optimizer step; validation, the checkpoint's weights, ``test(ckpt_path=...)`` and ``load_from_checkpoint``
see the average. Resume after SIGKILL is in tests/cli/test_verbs.py, sharded runs in tests/parallel/test_composition.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

from mmte.cli import MMTECLI, main
from mmte.training.ema import WeightEMA, check_decay

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "etth1_forecast.yaml"
ETT = ROOT / ".." / "shared" / "data" / "ett" / "ETTh1.csv"
FAST = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", "--trainer.logger", "false"]


class NaiveEMA(Callback):
    """The average, computed here from the live weights after every optimizer step (the formula of
    mmte.training.ema, written out), and the live weights at the end."""

    def __init__(self, decay: float):
        self.decay, self.avg, self.n, self.live = decay, {}, 0, {}

    def _trainable(self, pl_module):
        return {n: p.detach().clone().double() for n, p in pl_module.named_parameters() if p.requires_grad}

    def on_train_start(self, trainer, pl_module):
        self.avg, self.n = self._trainable(pl_module), 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        d = min(self.decay, (1 + self.n) / (10 + self.n))
        for k, w in self._trainable(pl_module).items():
            self.avg[k] = d * self.avg[k] + (1 - d) * w
        self.n += 1
        self.live = self._trainable(pl_module)


def _fit(tmp_path: Path, *extra: str):
    from tests.conftest import need_data

    need_data(ETT, "ETTh1")
    args = ["fit", "--config", str(RECIPE), "--data.init_args.path", str(ETT), "--model.backbone", "{preset: tiny, num_layers: 2}",
            "--data.init_args.train_step", "16", "--data.init_args.eval_step", "48", "--trainer.max_epochs", "2",
            "--trainer.limit_train_batches", "5", "--trainer.val_check_interval", "1.0", "--model.ema_decay", "0.8", "--model.lr", "0.01", "--model.warmup", "0", *FAST, "--trainer.default_root_dir", str(tmp_path / "run"), *extra]
    cli = MMTECLI(args=args)
    naive = next(cb for cb in cli.trainer.callbacks if isinstance(cb, NaiveEMA))
    return cli, naive


def _holds_only_the_average(trainer, module, naive: NaiveEMA, path: Path) -> None:
    """The model holds the averaged weights as its only weights, kept by an evaluation: a validation leaves
    them in place, and a checkpoint saved now holds them once, with no live weights or average beside them."""
    trainer.validate(module, datamodule=trainer.datamodule, verbose=False)
    for k, v in naive.avg.items():
        torch.testing.assert_close(dict(module.named_parameters())[k].detach().double(), v, rtol=1e-5, atol=1e-6, msg=k)
    trainer.save_checkpoint(path)
    ck = torch.load(path, map_location="cpu", weights_only=False)
    assert "current_model_state" not in ck and "ema" not in ck.get("mmte", {})
    for k, v in naive.avg.items():
        torch.testing.assert_close(ck["state_dict"][k].double(), v, rtol=1e-5, atol=1e-6, msg=k)


def test_ema_is_the_average_of_the_live_weights_and_what_evaluation_and_checkpoints_see(tmp_path):
    cli, naive = _fit(tmp_path, "--trainer.callbacks+=tests.training.test_ema.NaiveEMA", "--trainer.callbacks.decay", "0.8")
    trainer, module = cli.trainer, cli.model
    logged = float(trainer.callback_metrics["val_mse"])  # the fit's last validation
    assert naive.n == 10  # 2 epochs x 5 steps
    own = {n: p.detach().double() for n, p in module.named_parameters() if p.requires_grad}
    assert set(own) == set(naive.avg)
    for k, v in naive.avg.items():
        torch.testing.assert_close(own[k], v, rtol=1e-5, atol=1e-6, msg=k)
    _holds_only_the_average(trainer, module, naive, tmp_path / "after_fit.ckpt")  # the model took the average at the end
    head = "model.heads.forecast.proj.weight"
    assert (naive.live[head] - naive.avg[head]).abs().max() > 3e-4  # the average is not the live weights

    ck = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ck["mmte"]["ema"] == {"decay": 0.8, "updates": 10}
    for k, v in naive.avg.items():
        torch.testing.assert_close(ck["state_dict"][k].double(), v, rtol=1e-5, atol=1e-6, msg=k)
        torch.testing.assert_close(ck["current_model_state"][k].double(), naive.live[k], rtol=0, atol=0, msg=k)

    # the last validation of the fit ran with the average: the model (holding it now) validates the same
    again = trainer.validate(module, datamodule=cli.datamodule, verbose=False)[0]["val_mse"]
    assert again == pytest.approx(logged, rel=1e-6)
    with torch.no_grad():  # and the live weights would have scored differently
        for n, p in module.named_parameters():
            if n in naive.live:
                p.copy_(naive.live[n])
    live = trainer.validate(module, datamodule=cli.datamodule, verbose=False)[0]["val_mse"]
    assert abs(live - logged) > 1e-4

    # evaluating a checkpoint (in-process, as after a fit) loads its averaged weights, not the live ones
    tested = trainer.test(module, datamodule=cli.datamodule, ckpt_path=str(tmp_path / "run" / "checkpoints" / "last.ckpt"), verbose=False)[0]
    for k, v in naive.avg.items():
        torch.testing.assert_close(dict(module.named_parameters())[k].detach().double(), v, rtol=1e-5, atol=1e-6, msg=k)
    _holds_only_the_average(trainer, module, naive, tmp_path / "after_test.ckpt")
    loaded = type(module).load_from_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu")
    for k, v in naive.avg.items():
        torch.testing.assert_close(dict(loaded.named_parameters())[k].detach().double(), v, rtol=1e-5, atol=1e-6, msg=k)
    assert tested["test_mse"] > 0


def test_weight_ema_swaps_back_and_refuses_updates_while_swapped():
    lin = torch.nn.Linear(3, 2)
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    mod = torch.nn.Sequential(lin, frozen)
    w0 = lin.weight.detach().clone()
    ema = WeightEMA(mod, 0.5)
    assert ema.names == ["0.weight", "0.bias"]  # trainable only
    with torch.no_grad():
        lin.weight.add_(1.0)
    ema.update()  # first update: d = min(0.5, 1/10) = 0.1
    torch.testing.assert_close(ema.avg[0], 0.1 * w0 + 0.9 * (w0 + 1))
    with ema.holding(averaged=True):
        torch.testing.assert_close(lin.weight.detach(), 0.1 * w0 + 0.9 * (w0 + 1))
        with pytest.raises(RuntimeError, match="swapped"):
            ema.update()
        with ema.holding(averaged=True):  # already: nothing changes
            torch.testing.assert_close(lin.weight.detach(), 0.1 * w0 + 0.9 * (w0 + 1))
    torch.testing.assert_close(lin.weight.detach(), w0 + 1)
    assert not ema.swapped


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, True, "0.9"])
def test_bad_ema_decay_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=r"ema_decay must be a number in \(0, 1\)"):
        check_decay(bad)


def test_bad_ema_decay_through_the_cli_is_one_line_error(tmp_path, capsys):
    assert main(["fit", "--config", str(RECIPE), "--model.ema_decay", "1.0", *FAST, "--trainer.default_root_dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "ema_decay must be a number in (0, 1)" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_ema_decay_and_a_weight_averaging_callback_are_refused_together(tmp_path):
    with pytest.raises(ValueError, match="use one of them"):
        _fit(tmp_path, "--trainer.callbacks+=lightning.pytorch.callbacks.EMAWeightAveraging")


def test_ema_with_lora_and_fp8_on_the_quickstart(tmp_path):
    """The weight average combined with LoRA adapters and FP8 (delayed scaling, emulated on the CPU) on the
    quickstart: the checkpoint's averaged and live weights both hold the LoRA tensors (and only trainable
    tensors where the frozen backbone has a source), the adapters moved, and the average differs from them."""
    from tests.conftest import need_data

    need_data(ROOT / ".." / "shared" / "data" / "fsdd" / "recordings", "FSDD recordings")
    args = ["fit", "--config", str(ROOT / "recipes" / "quickstart.yaml"), "--config", str(ROOT / "configs" / "models" / "lora.yaml"),
            "--config", str(ROOT / "configs" / "precision" / "fp8-delayed.yaml"), "--model.ema_decay", "0.5", "--model.lr", "0.01",
            "--trainer.max_steps", "4", "--trainer.limit_val_batches", "1", "--data.init_args.batch_size", "16", *FAST,
            "--trainer.default_root_dir", str(tmp_path / "run")]
    cli = MMTECLI(args=args)
    ck = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ck["mmte"]["ema"] == {"decay": 0.5, "updates": 4}
    avg, live = ck["state_dict"], ck["current_model_state"]
    lora_b = [k for k in avg if k.endswith(".lora.B")]
    assert lora_b and set(avg) == set(live)
    assert "frozen" in ck["mmte"] and not any(k in avg for k in ck["mmte"]["frozen"]["keys"])  # trainable-only, both sets
    assert all(float(live[k].abs().sum()) > 0 for k in lora_b)  # the adapters trained (B starts at zero)
    assert any(not torch.equal(avg[k], live[k]) for k in lora_b)
    own = dict(cli.model.named_parameters())
    for k in lora_b:  # the model ends with the average
        torch.testing.assert_close(own[k].detach(), avg[k], rtol=0, atol=0)
