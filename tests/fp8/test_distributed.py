"""Delayed-scaling amax reduction across processes (2 CPU processes, gloo): every rank ends with the
history and scales of the max over ranks, for forward and gradient roles."""

import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.parallel._dist import free_port, start_method


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    import torch.distributed as dist

    from mmte import fp8

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)  # same weights on both ranks
        lin = fp8.FP8Linear(32, 16, recipe=fp8.DelayedScaling(amax_history_len=4))
        results = []
        for step in range(2):
            x = torch.randn(16, 32, generator=torch.Generator().manual_seed(10 * step + rank)) * (1 + 3 * rank)
            with fp8.autocast(recipe=fp8.DelayedScaling(amax_history_len=4)):  # default group: the world
                y = lin(x)
            (y * (1 + rank)).sum().backward()
            local = (x.abs().max().item(), None)
            fp8.update_scales()
            results.append({"local_in": local[0], "hist": lin.fp8_amax_history.clone(), "scale": lin.fp8_scale.clone()})
        # an explicit group (here: a group of this rank alone) keeps amaxes local
        solo = [dist.new_group([r]) for r in range(world)][rank]
        lin2 = fp8.FP8Linear(32, 16, recipe=fp8.DelayedScaling(amax_history_len=4))
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(99 + rank)) * (1 + 3 * rank)
        with fp8.autocast(recipe=fp8.DelayedScaling(amax_history_len=4), amax_reduction_group=solo):
            lin2(x)
        results.append({"solo_hist": lin2.fp8_amax_history[0, 0].item(), "solo_local": x.abs().max().item()})
        torch.save(results, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_amax_reduced_across_ranks(tmp_path):
    world = 2
    mp.start_processes(_worker, args=(world, free_port(), str(tmp_path)), nprocs=world, start_method=start_method(), join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world))
    for s in range(2):
        torch.testing.assert_close(r0[s]["hist"], r1[s]["hist"], rtol=0, atol=0)
        torch.testing.assert_close(r0[s]["scale"], r1[s]["scale"], rtol=0, atol=0)
        want = max(r0[s]["local_in"], r1[s]["local_in"])
        assert r0[s]["hist"][0, 0].item() == pytest.approx(want, rel=1e-6)
        assert r0[s]["local_in"] != r1[s]["local_in"]
    assert r0[1]["hist"][2, 0] > 0 and r0[1]["hist"][2, 1] > 0  # gradient amaxes of both steps
    assert r0[2]["solo_hist"] == pytest.approx(r0[2]["solo_local"]) and r1[2]["solo_hist"] == pytest.approx(r1[2]["solo_local"])


def _tp_worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from mmte import fp8

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        recipe = fp8.DelayedScaling(amax_history_len=4)

        def mlp():
            torch.manual_seed(0)
            return torch.nn.Sequential(fp8.FP8Linear(32, 64, recipe=recipe), torch.nn.GELU(), fp8.FP8Linear(64, 32, recipe=recipe))

        ref, tp = mlp(), mlp()
        mesh = init_device_mesh("cpu", (world,))
        parallelize_module(tp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        xs = [torch.randn(3, 11, 32, generator=torch.Generator().manual_seed(s)) for s in range(2)]  # 33 rows: padded
        def step(model, x):
            model.zero_grad()
            xx = x.clone().requires_grad_()
            with fp8.autocast(recipe=recipe):
                y = model(xx)
            y = y.full_tensor() if hasattr(y, "full_tensor") else y
            (y * torch.linspace(-1, 1, 32)).sum().backward()
            fp8.update_scales()
            return y.detach(), xx.grad

        # a first step on the reference only; the TP model starts from its scaling state, so that both
        # quantize the next step with the same (delayed) scales
        step(ref, xs[0])
        for mr, mt in zip(ref, tp):
            if isinstance(mr, fp8.FP8Linear):
                for name in ("fp8_amax_history", "fp8_scale", "fp8_amax_pending"):
                    setattr(mt, name, getattr(mr, name).clone())  # the buffer replaced, as registered
        res = {}
        for name, model in (("ref", ref), ("tp", tp)):
            y, dx = step(model, xs[1])
            grads = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in model.parameters()]
            res[name] = {"y": y, "dx": dx, "grads": grads,
                         "hist": [m.fp8_amax_history.clone() for m in model if isinstance(m, fp8.FP8Linear)]}
        torch.save(res, f"{out}/tp{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_tensor_parallel_fp8_matches_single_device(tmp_path):
    """Column-/row-wise sharded FP8 linears (DTensor weights) with TP-reduced amaxes give the
    single-device FP8 result when both start from the same delayed-scaling state (same scales, so the
    same FP8 codes; only the fp32 summation order of the row-wise partial sums differs), and their
    amax histories stay equal to the single-device ones."""
    world = 2
    mp.start_processes(_tp_worker, args=(world, free_port(), str(tmp_path)), nprocs=world, start_method=start_method(), join=True)
    for r in range(world):
        res = torch.load(tmp_path / f"tp{r}.pt", weights_only=False)
        ref, tp = res["ref"], res["tp"]
        for a, b in zip(ref["hist"], tp["hist"]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=0)
        torch.testing.assert_close(tp["y"], ref["y"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(tp["dx"], ref["dx"], rtol=1e-5, atol=1e-6)
        for a, b in zip(ref["grads"], tp["grads"]):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
