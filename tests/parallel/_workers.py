"""Worker functions for the multi-process tests (importable by spawned children).

Each worker builds the single-process reference itself (same seed, same batch) and asserts against it,
so a failure on any rank fails the test with that rank's traceback.
"""

from __future__ import annotations

import copy
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mmte.encoders import Backbone
from mmte.parallel import ParallelConfig, ParallelDims, build_mesh, parallelize
from mmte.parallel import checkpoint as ckpt
from mmte.parallel.mesh import amax_group, dp_mesh
from mmte.tokenizers.image import ImageTokenizer

ATOL = 1e-5  # fp32 (TE's tolerance)


class TinyModel(nn.Module):
    """Image tokenizer -> tiny backbone -> linear head on the cls token; skips parts that are None (PP)."""

    def __init__(self, num_layers: int = 4, num_classes: int = 5, **overrides):
        super().__init__()
        self.tokenizer = ImageTokenizer(64, img_size=8, patch_size=4, in_chans=1)  # 1 cls + 4 patches = 5 tokens
        self.backbone = Backbone("tiny", num_layers=num_layers, **overrides)
        self.head = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tokenizer is not None:
            x = self.tokenizer(x).tokens
        x = self.backbone(x)
        if self.head is not None:
            x = self.head(x[:, 0])
        return x


def make_model(seed: int = 0, **kw) -> TinyModel:
    torch.manual_seed(seed)
    return TinyModel(**kw)


def batch(step: int, n: int = 8):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 5, (n,), generator=g)


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def assert_close(a, b, what: str, atol: float = ATOL):
    a, b = full(a).detach(), full(b).detach()
    err = (a - b).abs().max().item() if a.numel() else 0.0
    if a.shape != b.shape or err > atol:
        raise AssertionError(f"rank {dist.get_rank()}: {what}: shapes {tuple(a.shape)} vs {tuple(b.shape)}, max err {err:.3g} > {atol}")


def compare_grads(model: nn.Module, ref: nn.Module, tag: str, atol: float = ATOL) -> int:
    ref_p = dict(ref.named_parameters())
    n = 0
    for name, p in model.named_parameters():
        name = name.removeprefix("module.")  # DDP's wrapper
        assert p.grad is not None, f"{tag}: {name} has no grad"
        assert_close(p.grad, ref_p[name].grad, f"{tag} grad {name}", atol)
        n += 1
    assert n > 0, f"{tag}: no parameters compared"
    return n


# ------------------------------------------------------------------------------------------ TP (2 procs)
def tp_worker(rank: int, world: int, tmp: str) -> None:
    dims = ParallelDims(tp=2, dp_shard=1).resolve(world)
    mesh = build_mesh(dims)
    x, y = batch(0, 4)
    ref = make_model()
    ref_out = ref(x)
    F.cross_entropy(ref_out, y).backward()
    for sp in (False, True):
        m = make_model()
        par = parallelize(m, mesh, ParallelConfig(sequence_parallel=sp))
        out = par.model(x)
        assert_close(out, ref_out, f"tp=2 sp={sp} forward")
        F.cross_entropy(out, y).backward()
        n = compare_grads(par.model, ref, f"tp=2 sp={sp}")
        assert n == len(list(ref.parameters()))
        qkv = par.model.backbone.layers["0"].self_attention.layernorm_qkv.linear.weight
        assert qkv.to_local().shape[0] == 3 * 64 // 2, qkv.to_local().shape  # two of four heads per rank

    # padding mask + odd length (7 tokens) through a sequence-parallel backbone, and a gated MLP (`up`)
    torch.manual_seed(1)
    bb_ref = Backbone("tiny", activation="swiglu")
    bb = copy.deepcopy(bb_ref)
    parallelize(bb, mesh, ParallelConfig(sequence_parallel=True))
    h = torch.randn(3, 7, 64, generator=torch.Generator().manual_seed(2))
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 4:] = False
    mask[2, 6:] = False
    ref_h, got = bb_ref(h, mask), bb(h, mask)
    assert got.shape == (3, 7, 64)
    assert_close(got[mask], ref_h[mask], "sp backbone with padding mask")
    (ref_h[mask].square().mean()).backward()
    (got[mask].square().mean()).backward()
    compare_grads(bb, bb_ref, "sp backbone swiglu")

    # DCP: train 2 steps at TP=2, save, record the next two losses; rank 0 then resumes at TP=1
    m = make_model()
    par = parallelize(m, mesh, ParallelConfig())
    opt = torch.optim.AdamW(par.model.parameters(), lr=1e-2)
    losses = []
    for step in range(4):
        if step == 2:
            ckpt.save(os.path.join(tmp, "tp2"), par.model, opt, extra={"step": 2})
        xb, yb = batch(step)
        loss = F.cross_entropy(par.model(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    if rank == 0:
        with open(os.path.join(tmp, "tp2_losses.json"), "w") as f:
            json.dump(losses, f)

    # FP8 (delayed scaling, emulated GEMMs) converted by parallelize's first step, then TP=2: the amaxes
    # are max-reduced over the TP group, so 3 steps equal the single-process FP8 model
    from mmte import fp8

    recipe = fp8.DelayedScaling(amax_history_len=4)
    ref = fp8.convert(make_model(), recipe)
    par = parallelize(make_model(), mesh, ParallelConfig(), fp8_convert=lambda mod: fp8.convert(mod, recipe))
    assert type(par.model.backbone.layers["0"].layernorm_mlp.fc1).__name__ == "FP8Linear"
    # The first pass quantizes with just-in-time scales, per shard under TP, so the two runs' amax
    # histories start apart and stay apart. Start both from the same scaling state instead: one warm-up
    # pass of the reference, its histories/scales copied into the TP model. From there on they stay
    # equal only if every amax is max-reduced over the TP group (row-parallel inputs are sharded).
    with fp8.autocast(recipe=recipe):
        F.cross_entropy(ref(batch(9)[0]), batch(9)[1]).backward()
    fp8.update_scales()
    ref.zero_grad()
    pairs = [(a, b) for a, b in zip(ref.modules(), par.model.modules()) if hasattr(a, "fp8_scale")]
    assert len(pairs) == 16, len(pairs)  # 4 layers x (qkv, proj, fc1, fc2)
    for a, b in pairs:
        for name in ("fp8_amax_history", "fp8_scale", "fp8_amax_pending"):
            setattr(b, name, getattr(a, name).clone())  # a registered buffer: replaced (TP replicated them as DTensors; FP8Linear keeps them local)
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.05) for m in (par.model, ref))
    for step in range(3):
        xb, yb = batch(step)
        for model, o, out in ((ref, ref_opt, "ref"), (par.model, opt, "tp")):
            with fp8.autocast(recipe=recipe):
                loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            fp8.update_scales()  # fold this step's gradient amaxes in now, to compare every role
            o.step()
            o.zero_grad()
            if out == "ref":
                ref_loss = loss.item()
        # FP8 codes sit on a coarse grid: a different fp32 summation order can flip a rounding
        assert abs(loss.item() - ref_loss) < 1e-3, (step, loss.item(), ref_loss)
        for (name, a), b in zip(((n, m) for n, m in ref.named_modules() if hasattr(m, "fp8_scale")), (b for _, b in pairs)):
            assert_close(b.fp8_scale, a.fp8_scale, f"step {step} {name} fp8 scales", atol=1e-4 * float(a.fp8_scale.abs().max()))

    # DDP over 2 replicas (bucket size + static graph options): 3 steps equal one process on the global batch
    mesh = build_mesh(ParallelDims(dp_replicate=2, dp_shard=1).resolve(world))
    cfg = ParallelConfig(ddp={"bucket_cap_mb": 0.01, "static_graph": True})
    par = parallelize(make_model(), mesh, cfg)
    # composable replicate: the model keeps its attributes and FQNs (no DistributedDataParallel wrapper)
    assert isinstance(par.model, type(ref0 := make_model())) and list(par.model.state_dict()) == list(ref0.state_dict())
    ref = make_model()
    opt, ref_opt = (torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (par.model, ref))
    for step in range(3):
        xb, yb = batch(step)
        ref_loss = F.cross_entropy(ref(xb), yb)
        ref_loss.backward()
        loss = F.cross_entropy(par.model(xb.chunk(2)[rank]), yb.chunk(2)[rank])
        loss.backward()
        compare_grads(par.model, ref, f"ddp step {step}")
        for o in (opt, ref_opt):
            o.step()
            o.zero_grad()
        t = loss.detach().reshape(1)
        dist.all_reduce(t)
        assert abs(t.item() / 2 - ref_loss.item()) < 1e-5, (step, t.item() / 2, ref_loss.item())


def resume_tp1(tmp: str) -> tuple[list[float], list[float], int]:
    """Single process, no process group: load the TP=2 checkpoint into a plain model and continue."""
    m = make_model(seed=123)  # different init: everything must come from the checkpoint
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    extra = ckpt.load(os.path.join(tmp, "tp2"), m, opt)
    got = []
    for step in (2, 3):
        xb, yb = batch(step)
        loss = F.cross_entropy(m(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad()
        got.append(loss.item())
    with open(os.path.join(tmp, "tp2_losses.json")) as f:
        want = json.load(f)[2:]
    return got, want, int(extra["step"])


# ------------------------------------------------------------------------------------------ PP (2 procs)
def pp_worker(rank: int, world: int, schedules: list[str], tmp: str) -> None:
    dims = ParallelDims(pp=2, dp_shard=1).resolve(world)
    mesh = build_mesh(dims)
    x, y = batch(0, 8)
    ref = make_model()
    ref_loss = F.cross_entropy(ref(x), y)
    ref_loss.backward()
    for name in schedules:
        m = make_model()
        mb = 4
        par = parallelize(m, mesh, ParallelConfig(pp_schedule=name, microbatches=mb), loss_fn=F.cross_entropy)
        losses: list = []
        kw = {}
        if par.has_last_stage:
            kw.update(target=y, losses=losses)
        if par.has_first_stage:
            par.schedule.step(x, **kw)
        else:
            par.schedule.step(**kw)
        if par.has_last_stage:
            assert len(losses) == mb, (name, len(losses))
            assert_close(torch.stack(losses).mean(), ref_loss, f"{name} loss")
        compare_grads(par.model, ref, name)
        ref_names = {n for n, _ in ref.named_parameters()}
        held = [n for n, _ in par.model.named_parameters()]
        assert set(held) <= ref_names and held, (name, held)
        owned = torch.tensor([len(held)])
        dist.all_reduce(owned)
        assert owned.item() == len(ref_names), f"{name}: stages hold {owned.item()} of {len(ref_names)} parameters"
        if name == "1f1b":  # PP=2 checkpoint, resumed without PP
            ckpt.save(os.path.join(tmp, "pp2"), par.model)


# ------------------------------------------------------------------------------------------ 4 procs
def hybrid_worker(rank: int, world: int, steps: int) -> None:
    """DP=2 x TP=2 (FSDP2 + TP/SP + AC), PP=2 x DP=2 (1F1B + FSDP2), PP=2 x TP=2: loss curves equal one process."""
    results = {}
    layouts = {"dp2_tp2": ParallelDims(tp=2, dp_shard=2), "pp2_dp2": ParallelDims(pp=2, dp_shard=2), "pp2_tp2": ParallelDims(pp=2, tp=2, dp_shard=1)}
    for layout, dims in layouts.items():
        mesh = build_mesh(dims.resolve(world))
        dp_rank, dp = dp_mesh(mesh).get_local_rank(), dp_mesh(mesh).size()
        group = amax_group(mesh)
        if layout.startswith("pp2"):  # FP8 scales agree within a stage: the 2 dp/tp ranks of one pp coordinate
            members = dist.get_process_group_ranks(group)
            assert len(members) == 2 and len({r // 2 for r in members}) == 1, members
        else:
            assert group is None
        ref = make_model()
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        # dp2_tp2 also recomputes every layer (activation checkpointing); pp2_dp2 keeps gathered params (ZeRO-2)
        if layout == "pp2_tp2":  # 5 tokens cannot be split over tp=2 inside a stage: a clear error, then SP off
            bad = parallelize(make_model(), mesh, ParallelConfig(sequence_parallel=True, microbatches=2), loss_fn=F.cross_entropy)
            if bad.has_first_stage:
                try:
                    bad.parts[0](batch(0)[0])  # the first stage view
                    raise AssertionError("expected a ValueError for 5 tokens under SP in a pipeline stage")
                except ValueError as e:
                    assert "token count (5) to be a multiple of tp=2" in str(e), e
        cfg = ParallelConfig(
            sequence_parallel=layout != "pp2_tp2",
            microbatches=2,
            pp_schedule="1f1b",
            activation_checkpointing="full" if layout == "dp2_tp2" else "none",
            fsdp={"reshard_after_forward": layout == "dp2_tp2"},
        )
        par = parallelize(make_model(), mesh, cfg, loss_fn=F.cross_entropy)
        opt = torch.optim.AdamW(par.model.parameters(), lr=1e-2)
        got, want = [], []
        for step in range(steps):
            xb, yb = batch(step)
            loss = F.cross_entropy(ref(xb), yb)
            loss.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            want.append(loss.item())
            lx, ly = xb.chunk(dp)[dp_rank], yb.chunk(dp)[dp_rank]
            if par.schedule is None:
                loss_t = F.cross_entropy(par.model(lx), ly)
                loss_t.backward()
                local = loss_t.detach()
            else:
                losses: list = []
                kw = {"target": ly, "losses": losses} if par.has_last_stage else {}
                par.schedule.step(lx, **kw) if par.has_first_stage else par.schedule.step(**kw)
                local = torch.stack(losses).mean() if par.has_last_stage else torch.zeros(())
            opt.step()
            opt.zero_grad()
            # the global loss: mean over dp ranks (every tp rank holds a copy; only last pp stages hold one)
            t = local.reshape(1).clone()
            dist.all_reduce(t)
            holders = dp * mesh["tp"].size()
            got.append(t.item() / holders)
        for i, (a, b) in enumerate(zip(got, want)):
            assert abs(a - b) <= 1e-4, f"rank {rank} {layout}: step {i} loss {a:.6f} vs single-process {b:.6f}"
        results[layout] = got
