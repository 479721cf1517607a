"""mmte.parallel: validation, plans and splits in-process; TP / PP / DPxTP / PPxDP / DCP in real gloo jobs."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from mmte.encoders import Backbone
from mmte.parallel import ParallelConfig, ParallelDims, bubble_fraction, stage_fqns, tp_plan
from mmte.parallel import checkpoint as ckpt
from mmte.parallel.pipeline import make_stage_module, partition, pipeline_split, stage_ids
from mmte.parallel.tp import glob_matches

from . import _dist, _workers


# ------------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize(
    "dims, kw, msg",
    [
        (ParallelDims(tp=3, dp_shard=1), {"world_size": 3, "num_attention_heads": 4}, "tp=3 does not divide the number of attention heads 4"),
        (ParallelDims(pp=4, dp_shard=1), {"world_size": 4, "num_layers": 2}, "4 pipeline stages is more than the 2 backbone layers"),
        (ParallelDims(pp=2, dp_shard=1), {"world_size": 2, "num_layers": 3, "stages_per_rank": 2}, "pp=2 x 2 stage(s) per rank = 4"),
        (ParallelDims(tp=2, dp_shard=3), {"world_size": 4}, "1*3*2*1 = 6 differs from the world size 4"),
        (ParallelDims(tp=3), {"world_size": 4}, "world size 4 is not divisible by dp_replicate*tp*pp = 1*3*1 = 3"),
        (ParallelDims(tp=2, dp_shard=1), {"world_size": 2, "num_attention_heads": 4, "ffn_hidden_size": 129}, "ffn_hidden_size=129"),
    ],
)
def test_bad_configuration_rejected_before_process_groups(dims, kw, msg):
    with pytest.raises(ValueError) as e:
        dims.validate(**kw)
    assert msg in str(e.value)
    assert not dist.is_initialized()


def test_dims_resolve_and_types():
    d = ParallelDims(tp=2, pp=2).resolve(8)
    assert (d.dp_replicate, d.dp_shard, d.tp, d.pp, d.dp, d.world_size) == (1, 2, 2, 2, 2, 8)
    with pytest.raises(ValueError, match="tp must be an int >= 1; got 0"):
        ParallelDims(tp=0)
    with pytest.raises(ValueError, match="dp_shard must be an int >= 1 or -1"):
        ParallelDims(dp_shard=0)


def test_parallel_config_validates():
    with pytest.raises(ValueError, match="unknown pipeline schedule 'zb'"):
        ParallelConfig(pp_schedule="zb")
    with pytest.raises(ValueError, match="activation_checkpointing must be 'none' or 'full'; got 'some'"):
        ParallelConfig(activation_checkpointing="some")
    assert ParallelConfig(fsdp={"reshard_after_forward": False}).fsdp.reshard_after_forward is False


# ------------------------------------------------------------------------------------------ TP plans
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("overrides", [{}, {"activation": "swiglu"}, {"layer_norm_position": "post"}, {"num_layers": 1}])
def test_every_plan_glob_matches_a_module(sp, overrides):
    bb = Backbone("tiny", **overrides)
    plan = tp_plan(bb, sequence_parallel=sp)
    for glob in plan:
        assert glob_matches(bb, glob), f"plan key {glob!r} matches no module"
    assert ("layers.*.layernorm_mlp.up" in plan) == (overrides.get("activation") == "swiglu")
    post = overrides.get("layer_norm_position") == "post"
    assert ("layers.*.post_mlp_layernorm" in plan) == (sp and post)
    assert ("layers.*.layernorm_mlp.norm" in plan) == (sp and not post)  # post-norm layers have Identity there
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    styles = list(plan.values())
    assert any(isinstance(s, ColwiseParallel) for s in styles) and any(isinstance(s, RowwiseParallel) for s in styles)
    assert any(isinstance(s, SequenceParallel) for s in styles) == sp


def test_backbone_fqns_are_the_plan_contract():
    names = {n for n, _ in Backbone("tiny").named_modules()}
    for fqn in (
        "layers.0.self_attention.layernorm_qkv.linear",
        "layers.0.self_attention.layernorm_qkv.norm",
        "layers.0.self_attention.proj",
        "layers.1.layernorm_mlp.fc1",
        "layers.1.layernorm_mlp.fc2",
        "layers.1.layernorm_mlp.norm",
    ):
        assert fqn in names


# ------------------------------------------------------------------------------------------ PP split
def test_partition_balances_by_weight():
    assert partition([1, 1, 1, 1], 2) == [[0, 1], [2, 3]]
    assert partition([5, 1, 1, 1, 1, 1], 2) == [[0], [1, 2, 3, 4, 5]]
    assert partition([1] * 7, 3) == [[0, 1], [2, 3], [4, 5, 6]]
    with pytest.raises(ValueError, match="cannot split 2 layers into 3 pipeline stages"):
        partition([1, 1], 3)


def test_stage_fqns_place_tokenizer_first_and_head_last():
    m = _workers.make_model(num_layers=4)
    s = stage_fqns(m, 2)
    assert s == [
        ["tokenizer", "backbone.layers.0", "backbone.layers.1"],
        ["backbone.layers.2", "backbone.layers.3", "backbone.norm", "head"],
    ]
    s3 = stage_fqns(m, 3, balance=[4, 1, 1, 1])  # a heavy first layer gets a stage of its own
    assert [[x for x in s if "layers" in x] for s in s3] == [
        ["backbone.layers.0"], ["backbone.layers.1"], ["backbone.layers.2", "backbone.layers.3"]
    ]
    with pytest.raises(ValueError, match="balance weights must be 4 positive numbers"):
        stage_fqns(m, 2, balance=[1, 2])
    with pytest.raises(ValueError, match="4 pipeline stages is more than the 2 backbone layers"):
        pipeline_split(_workers.make_model(num_layers=2), 0, 2, schedule="zbv")


def test_stage_ids_looped_and_v():
    assert stage_ids("1f1b", 1, 2) == [1]
    assert stage_ids("interleaved_1f1b", 1, 2, 2) == [1, 3]
    assert stage_ids("zbv", 0, 2) == [0, 3]
    assert stage_ids("dualpipev", 1, 2) == [1, 2]


def test_stages_chained_equal_the_model_and_keep_fqns():
    m = _workers.make_model(num_layers=4)
    x, _ = _workers.batch(0, 3)
    want = m(x)
    views = [make_stage_module(m, f) for f in stage_fqns(m, 4)]
    h = x
    for v in views:
        h = v(h)
    torch.testing.assert_close(h, want, rtol=0, atol=0)
    # FQNs are the model's; leaves are shared; the original model is untouched
    names = [n for v in views for n, _ in v.named_parameters()]
    assert sorted(names) == sorted(n for n, _ in m.named_parameters())
    assert views[1].backbone.layers["1"] is m.backbone.layers["1"]
    assert views[0].head is None and views[0].backbone.norm is None and len(m.backbone.layers) == 4


def test_bubble_fraction_theory():
    assert bubble_fraction("1f1b", 4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction("gpipe", 2, 2) == pytest.approx(1 / 3)
    assert bubble_fraction("interleaved_1f1b", 4, 8, 2) == pytest.approx(3 / 19)


# ------------------------------------------------------------------------------------------ multi-process
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_tp2_matches_single_process_and_dcp_resumes_at_tp1(tmp_path):
    """TP=2 with and without SP (fwd+bwd, atol 1e-5), SP with padding + odd length, DCP TP=2 -> TP=1."""
    _dist.run(_workers.tp_worker, 2, str(tmp_path))
    got, want, step = _workers.resume_tp1(str(tmp_path))
    assert step == 2
    assert got == pytest.approx(want, abs=1e-5), (got, want)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_pp2_every_schedule_matches_single_process(tmp_path):
    """GPipe, 1F1B, Interleaved1F1B, ZBV, DualPipeV: loss and every gradient equal one process."""
    schedules = ["gpipe", "1f1b", "interleaved_1f1b", "zbv", "dualpipev"]
    _dist.run(_workers.pp_worker, 2, schedules, str(tmp_path))
    # the PP=2 checkpoint loads without PP, and exports to one consolidated safetensors file
    ref = _workers.make_model()
    m = _workers.make_model(seed=7)
    ckpt.load(tmp_path / "pp2", m)
    for (n, a), b in zip(ref.state_dict().items(), m.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=n)
    out = ckpt.export_safetensors(tmp_path / "pp2", tmp_path / "model.safetensors")
    flat = load_file(str(out))
    assert set(flat) == set(ref.state_dict())
    for n, t in ref.state_dict().items():
        torch.testing.assert_close(flat[n], t, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dp2_tp2_and_pp2_dp2_loss_curves_match_single_process():
    """4 processes: FSDP2(2) x TP/SP(2), 1F1B PP(2) x FSDP2(2), PP(2) x TP(2): 4 AdamW steps each within 1e-4
    (a step's loss follows every earlier update, so 4 steps cover sharded gradients, their reduction and
    the optimizer state as 10 did)."""
    _dist.run(_workers.hybrid_worker, 4, 4, timeout=280)
