"""MMTEStrategy and the MUSA accelerator: YAML fragments, registry names, early validation, and real
2-process Lightning fits (TP=2 with SP, PP=2 1F1B) against a single-process run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.distributed as dist
import yaml
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies import StrategyRegistry

from mmte.training.accelerator import MUSAAccelerator, parse_musa_devices, register_musa
from mmte.training.strategy import PRESETS, MMTEStrategy

from . import _workers
from ._launch import native_abort

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs" / "parallel").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_parallel_yaml_fragments_build_a_valid_strategy(path):
    cfg = yaml.safe_load(path.read_text())["trainer"]
    spec = cfg["strategy"]
    assert spec["class_path"] == "mmte.training.strategy.MMTEStrategy"
    s = MMTEStrategy(**spec["init_args"])
    dims = s.dims.validate(cfg["devices"], num_attention_heads=4, ffn_hidden_size=128, num_layers=4,
                           stages_per_rank=2 if s.parallel_config.pp_schedule == "zbv" and s.dims.pp > 1 else 1)
    assert dims.world_size == cfg["devices"]


def test_expected_fragments_exist():
    names = {p.stem for p in CONFIGS}
    assert {"tp2", "pp2-1f1b", "fsdp", "dp2-tp2", "pp2-dp2", "ddp"} <= names


def test_registered_names_resolve_in_trainer():
    for name in PRESETS:
        assert name in StrategyRegistry
    trainer = L.Trainer(strategy="mmte_tp2", accelerator="cpu", devices=2, logger=False)
    s = trainer.strategy
    assert isinstance(s, MMTEStrategy) and s.dims.tp == 2 and s.parallel_config.sequence_parallel
    assert not dist.is_initialized()


class _Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = _workers.make_model(num_layers=2)  # tiny: 4 heads, 2 layers


@pytest.mark.parametrize(
    "kw, world, msg",
    [
        ({"tp": 3, "dp_shard": 1}, 3, "tp=3 does not divide the number of attention heads 4"),
        ({"pp": 4, "dp_shard": 1}, 4, "4 pipeline stages is more than the 2 backbone layers"),
        ({"pp": 2, "dp_shard": 1, "pp_schedule": "zbv"}, 2, "pp=2 x 2 stage(s) per rank = 4 pipeline stages"),
        ({"tp": 2, "dp_shard": 2}, 2, "2*2*1 = 4 differs from the world size 2"),
    ],
)
def test_strategy_rejects_bad_layouts_before_process_groups(kw, world, msg):
    s = MMTEStrategy(**kw)
    s.connect(_Module())
    with pytest.raises(ValueError) as e:
        s.validate(world)
    assert msg in str(e.value)
    assert not dist.is_initialized()


def test_strategy_reads_an_unbuilt_backbone_from_hparams():
    class Unbuilt(L.LightningModule):
        def __init__(self, backbone="tiny"):
            super().__init__()
            self.save_hyperparameters()
            self.model = None  # built in configure_model, after the process group exists

    s = MMTEStrategy(tp=3, dp_shard=1)
    s.connect(Unbuilt())
    with pytest.raises(ValueError, match="tp=3 does not divide the number of attention heads 4"):
        s.validate(3)
    s = MMTEStrategy(pp=2, dp_shard=1, pp_schedule="interleaved_1f1b", virtual_stages=2)
    s.connect(Unbuilt({"preset": "tiny", "num_layers": 3}))
    with pytest.raises(ValueError, match="4 pipeline stages is more than the 3 backbone layers"):
        s.validate(2)
    assert not dist.is_initialized()


def test_backend_follows_mmte_device():
    # _get_process_group_backend is Lightning's override point (ModelParallelStrategy calls it in setup_distributed)
    s = MMTEStrategy()
    s.parallel_devices = [torch.device("cpu")] * 2
    s.cluster_environment = LightningEnvironment()
    assert s._get_process_group_backend() == "gloo"
    assert MMTEStrategy(process_group_backend="mccl")._get_process_group_backend() == "mccl"


def test_musa_device_parsing():
    assert parse_musa_devices(2, available=4) == [0, 1]
    assert parse_musa_devices("0,2", available=4) == [0, 2]
    assert parse_musa_devices(-1, available=3) == [0, 1, 2]
    assert parse_musa_devices("auto", available=2) == [0, 1]
    assert parse_musa_devices([1], available=2) == [1]
    with pytest.raises(ValueError, match=r"indices \[5\] requested but only 4 MUSA device\(s\)"):
        parse_musa_devices([5], available=4)
    with pytest.raises(ValueError, match="no MUSA device selected"):
        parse_musa_devices(0, available=2)
    with pytest.raises(ValueError, match="duplicate"):
        parse_musa_devices([0, 0], available=2)


def test_musa_registration_is_guarded():
    class Reg(dict):
        def register(self, name, cls, description=""):
            self[name] = cls

    reg = Reg()
    has_musa = MUSAAccelerator.is_available()
    assert register_musa(reg) == ("musa" in reg)
    if not has_musa:
        assert "musa" not in reg  # torch_musa missing here: nothing registered
    assert register_musa(reg, force=True) and reg["musa"] is MUSAAccelerator
    assert MUSAAccelerator.name() == "musa"
    with pytest.raises(ValueError, match="needs a musa device; got cpu"):
        MUSAAccelerator().setup_device(torch.device("cpu"))


def _fit(tmp_path: Path, specs: dict[str, dict], steps: int) -> dict[str, list[float]]:
    """Each layout's losses from one 2-process ``torchrun`` launch of tests/parallel/lightning_fit.py."""
    out = tmp_path / "losses.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(29400 + os.getpid() % 500),
           str(REPO / "tests" / "parallel" / "lightning_fit.py"), str(out), json.dumps(specs), str(steps)]
    for attempt in (1, 2):  # one more start after a native abort, as tests/parallel/_launch.py does
        proc = subprocess.run(cmd, check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        if attempt == 1 and proc.returncode != 0 and native_abort(proc):
            warnings.warn(f"lightning_fit.py died of a native abort; started again:\n{proc.stderr[-3000:]}", stacklevel=2)
            out.unlink(missing_ok=True)
            continue
        break
    assert proc.returncode == 0 and out.exists(), proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_lightning_fit_tp2_pp2_and_zbv_match_single_process(tmp_path):
    from .lightning_fit import reference

    want = reference(4)  # 4 training losses, then the validation loss after them
    got = _fit(tmp_path, {
        "tp2": {"tp": 2, "sequence_parallel": True, "dp_shard": 1},
        "pp2": {"pp": 2, "pp_schedule": "1f1b", "microbatches": 2, "dp_shard": 1},
        "pp2_zbv": {"pp": 2, "pp_schedule": "zbv", "microbatches": 4, "dp_shard": 1},
    }, 4)
    assert sorted(got) == ["pp2", "pp2_zbv", "tp2"]
    for name, losses in got.items():
        # validation runs forward-only through the stages under every schedule, V-shaped ones included
        assert losses == pytest.approx(want, abs=1e-4), (name, losses, want)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mmte_fit_with_the_tp2_fragment(tmp_path):
    """`mmte fit --config <recipe> --config configs/parallel/tp2.yaml` on 2 CPU processes writing a sharded
    (DCP) checkpoint (`save_distributed_checkpoint: true`; the default is one portable file, see
    test_portable.py), then its shards consolidated into full backbone tensors."""
    recipe = REPO / "recipes" / "tabular_wine.yaml"
    if not recipe.exists():
        pytest.skip(f"recipe {recipe} not present")
    root = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "mmte", "fit", "--config", str(recipe), "--config", str(REPO / "configs/parallel/tp2.yaml"),
           "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "1",
           "--trainer.strategy.init_args.save_distributed_checkpoint", "true", "--trainer.default_root_dir", str(root)]
    proc = subprocess.run(cmd, check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "tensor parallel tp=2 with sequence parallel" in proc.stderr + proc.stdout
    last = root / "checkpoints" / "last.ckpt"
    assert sorted(p.name for p in last.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    from safetensors.torch import load_file

    from mmte.encoders import Backbone
    from mmte.parallel import export_safetensors

    flat = load_file(str(export_safetensors(last, tmp_path / "bb.safetensors", prefix="state_dict.model.backbone.")))
    assert flat["layers.0.self_attention.layernorm_qkv.linear.weight"].shape == (192, 64)  # whole, not a TP shard
    bb = Backbone("tiny")
    bb.load_state_dict(flat, strict=True)
