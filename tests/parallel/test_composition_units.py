"""Single-process checks of the pieces the composition matrix relies on, each against an independent
reference: stage-boundary packing, reproducible meta materialisation, strict pretrained loading with key
normalisation, FP8 conversion keeping LoRA, the optimizer-state format conversions (against torch's own
flattened optimizer state), microbatch choice, trainable-work balancing and the data-parallel sampler."""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch
from torch import nn

import mmte
import mmte.fp8
from mmte.encoders import Backbone
from mmte.model import load_backbone_state
from mmte.parallel.boundary import pack, pack_rows, structure, unpack, unpack_rows
from mmte.parallel.materialize import materialize, module_seed
from mmte.parallel.pipeline import layer_costs, microbatches_for, schedule_accepts
from mmte.tokenizers.time_series import RevINStats

IMG = {"name": "image", "img_size": 8, "patch_size": 4, "in_chans": 1}
HEADS = {"d": {"name": "classification", "num_classes": 10}}


# ------------------------------------------------------------------------------------------- boundary
def test_boundary_roundtrip_is_bit_exact_and_only_differentiable_tensors_travel_as_floats():
    h = torch.randn(2, 5, 4, requires_grad=True)
    stats = RevINStats(torch.randn(2, 1, 3), torch.rand(2, 1, 3) + 0.5)
    tree = {"x": h, "seq": {"key": "image", "mask": torch.tensor([[1, 1, 0, 1, 1], [1, 0, 0, 0, 1]], dtype=torch.bool),
                            "num_prefix_tokens": 1, "positions": None, "extras": {"grid_size": (2, 2), "revin": stats}}}
    sent = pack(tree)
    assert [t.dtype for t in sent] == [torch.float32, torch.uint8, torch.int32, torch.int32]  # x, mask, mean, std
    assert sent[0] is h  # differentiable: as is, so its gradient flows back
    back = unpack([t.clone() for t in sent], structure(tree))
    assert back["seq"]["key"] == "image" and back["seq"]["num_prefix_tokens"] == 1 and back["seq"]["positions"] is None
    assert back["seq"]["extras"]["grid_size"] == (2, 2)
    assert torch.equal(back["seq"]["mask"], tree["seq"]["mask"]) and back["seq"]["mask"].dtype == torch.bool
    r = back["seq"]["extras"]["revin"]
    assert isinstance(r, RevINStats) and torch.equal(r.mean, stats.mean) and torch.equal(r.std, stats.std)


def test_pack_rows_splits_like_the_batch():
    batch = {"label": torch.tensor([3, 1, 4, 1]), "target": torch.randn(4, 2, 3), "flag": torch.tensor([True, False, True, True])}
    rows, struct = pack_rows(batch)
    assert rows.dtype == torch.uint8 and rows.shape[0] == 4
    for part, idx in zip(torch.tensor_split(rows, 2), (slice(0, 2), slice(2, 4))):
        got = unpack_rows(part, struct)
        for k, v in batch.items():
            assert torch.equal(got[k], v[idx]), k
    with pytest.raises(ValueError, match=r"per-sample tensors must share the batch dimension 4; got shapes \[\(3,\)\]"):
        pack_rows({"a": torch.zeros(4), "b": torch.zeros(3)})


# --------------------------------------------------------------------------------------- materialize
def test_materialize_is_independent_of_rng_history_and_per_module():
    def build():
        return mmte.MetaTransformer({"image": IMG}, "tiny", HEADS, freeze="none", device="meta")

    a, b = build(), build()
    torch.manual_seed(7)
    materialize(a, "cpu", seed=3)
    torch.manual_seed(7)
    torch.randn(1000)  # different RNG history before materialising
    materialize(b, "cpu", seed=3)
    for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), k
    # a module's values depend on (seed, its FQN) only: reproduce one layer by hand
    layer = Backbone("tiny").layers["1"]
    with torch.random.fork_rng():
        torch.manual_seed(module_seed(3, "backbone.layers.1.layernorm_mlp.fc1"))
        layer.layernorm_mlp.fc1.reset_parameters()
    assert torch.equal(layer.layernorm_mlp.fc1.weight, a.backbone.layers["1"].layernorm_mlp.fc1.weight)
    assert not torch.equal(a.backbone.layers["0"].layernorm_mlp.fc1.weight, a.backbone.layers["1"].layernorm_mlp.fc1.weight)


# ------------------------------------------------------------------------------------- pretrained load
def test_pretrained_load_normalises_keys_is_strict_and_ignores_adapters_and_fp8_state():
    src = Backbone("tiny")
    m = mmte.MetaTransformer({"image": IMG}, "tiny", HEADS, lora={"rank": 2})
    mmte.fp8.convert(m)  # adds fp8_* buffers, which no pretrained file carries
    sd = {f"model.backbone.{k}": v for k, v in src.state_dict().items()}  # a Lightning checkpoint's keys
    assert load_backbone_state(m.backbone, sd, "ckpt") == len([k for k in m.backbone.state_dict() if ".lora." not in k and ".fp8_" not in k])
    for k, v in src.state_dict().items():
        assert torch.equal(m.backbone.state_dict()[k], v), k
    bad = dict(sd)
    bad.pop("model.backbone.layers.1.layernorm_mlp.fc2.bias")
    bad["model.backbone.layers.7.extra"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"do not fit the 2x64 backbone: missing \['layers.1.layernorm_mlp.fc2.bias'\], unexpected \['layers.7.extra'\]"):
        load_backbone_state(m.backbone, bad, "bad")


# ------------------------------------------------------------------------------------------ FP8 x LoRA
def test_fp8_conversion_keeps_lora_and_the_adapters_train():
    torch.manual_seed(0)
    m = mmte.MetaTransformer({"image": IMG}, "tiny", HEADS, lora={"rank": 4}, freeze="backbone")
    ref = {n: p.detach().clone() for n, p in m.named_parameters() if ".lora." in n}
    mmte.fp8.convert(m, "delayed")
    lin = m.backbone.layers["0"].self_attention.layernorm_qkv.linear
    assert type(lin).__name__ == "FP8Linear" and hasattr(lin, "lora")  # on the forward path: checked below by zeroing B
    assert sorted(n for n, p in m.named_parameters() if ".lora." in n) == sorted(ref)
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.5)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    for _ in range(2):
        with mmte.fp8.autocast(recipe="delayed"):
            out = m({"image": x})
        m.loss(out, {"label": y})["loss"].backward()
        opt.step()
        opt.zero_grad()
    moved = [n for n, p in m.named_parameters() if ".lora.B" in n and not torch.equal(p, ref[n])]
    assert len(moved) == len([n for n in ref if ".lora.B" in n]) > 0
    # the adapter really is on the FP8 path: removing it changes the output
    with torch.no_grad(), mmte.fp8.autocast(recipe="delayed"):
        with_lora = m({"image": x})["d"]
        for mod in m.modules():
            if hasattr(mod, "lora"):
                mod.lora.B.zero_()
        without = m({"image": x})["d"]
    assert float((with_lora - without).abs().max()) > 1e-4


def test_autocast_without_any_fp8_gemm_warns_once():
    ac = importlib.import_module("mmte.fp8.autocast")  # the module (mmte.fp8.autocast the attribute is the function)
    ac._WARNED_NO_FP8 = False
    m = mmte.MetaTransformer({"image": IMG}, "tiny", HEADS)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(2):
            with mmte.fp8.autocast():
                m({"image": torch.randn(2, 1, 8, 8)})
    msgs = [str(x.message) for x in w if "no FP8 GEMM ran" in str(x.message)]
    assert len(msgs) == 1 and "mmte.fp8.convert(model, recipe)" in msgs[0]


# ------------------------------------------------------------------------------------ optimizer formats
def test_optimizer_state_conversions_match_torch_flattened_state():
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from mmte.training.portable import is_flat, optim_from_flat, optim_to_flat

    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    groups = [[("0.weight", model[0].weight), ("2.weight", model[2].weight)], [("0.bias", model[0].bias), ("2.bias", model[2].bias)]]
    opt = torch.optim.AdamW([{"params": [p for _, p in g], "weight_decay": wd} for g, wd in zip(groups, (0.1, 0.0))], lr=1e-2)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    names = [[n for n, _ in g] for g in groups]
    flat = optim_to_flat(opt.state_dict(), names)
    want = get_optimizer_state_dict(model, opt, options=StateDictOptions(flatten_optimizer_state_dict=True))
    assert is_flat(flat) and sorted(flat) == sorted(want)
    for k, v in want.items():
        assert torch.equal(flat[k], v) if isinstance(v, torch.Tensor) else flat[k] == v, k
    back = optim_from_flat(flat, names)
    fresh = torch.optim.AdamW([{"params": [p for _, p in g]} for g in groups], lr=1.0)
    fresh.load_state_dict(back)
    for a, b in zip(fresh.param_groups, opt.param_groups):
        assert a["lr"] == b["lr"] and a["weight_decay"] == b["weight_decay"]
    for p in model.parameters():
        assert torch.equal(fresh.state[p]["exp_avg"], opt.state[p]["exp_avg"])
    with pytest.raises(ValueError, match="groups of sizes \\[2, 2\\] but the model's trainable parameters form groups of sizes \\[1\\]"):
        optim_to_flat(opt.state_dict(), [["0.weight"]])


# --------------------------------------------------------------------------------- pipeline arithmetic
@pytest.mark.parametrize(
    "batch, schedule, m, pp, stages, want",
    [(64, "1f1b", 4, 2, 2, 4), (30, "1f1b", 4, 2, 2, 3), (29, "1f1b", 4, 2, 2, None), (29, "gpipe", 4, 2, 2, 1),
     (36, "interleaved_1f1b", 4, 2, 4, 4), (30, "interleaved_1f1b", 4, 2, 4, 2), (30, "zbv", 4, 2, 4, None), (32, "zbv", 8, 2, 4, 8)],
)
def test_microbatches_for_a_batch(batch, schedule, m, pp, stages, want):
    assert microbatches_for(batch, schedule, m, pp, stages) == want
    if want:
        assert batch % want == 0 and schedule_accepts(schedule, want, pp, stages)


def test_compute_balance_weighs_trainable_layers_more():
    m = mmte.MetaTransformer({"image": IMG}, Backbone("tiny", num_layers=4), HEADS,
                             freeze=["backbone.layers.0.*", "backbone.layers.1.*"])
    assert layer_costs(m, "compute") == [2.0, 2.0, 3.0, 3.0]
    assert layer_costs(m, "layers") == [1.0] * 4


# ------------------------------------------------------------------------------------------- sampler
def test_sampler_shards_one_global_permutation_into_the_same_global_batches():
    from mmte.training.data import train_sampler as EpochSeededSampler

    n, batch, replicas = 103, 8, 2
    one = list(EpochSeededSampler(n, seed=5))
    shards = [list(EpochSeededSampler(n, seed=5, num_replicas=replicas, rank=r)) for r in range(replicas)]
    assert all(len(s) == 52 for s in shards)
    for k in range(n // batch):
        per = batch // replicas
        merged = sorted(x for s in shards for x in s[k * per : (k + 1) * per])
        assert merged == sorted(one[k * batch : (k + 1) * batch]), k
    s = EpochSeededSampler(n, seed=5, num_replicas=2, rank=1)
    s.set_epoch(3)
    assert list(s) != shards[1]  # a new epoch, a new permutation
