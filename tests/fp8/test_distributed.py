"""Delayed-scaling amax reduction across processes (2 CPU processes, gloo): every rank ends with the
history and scales of the max over ranks, for forward and gradient roles."""

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    import torch.distributed as dist

    import mmte.fp8 as fp8

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
    mp.start_processes(_worker, args=(world, _free_port(), str(tmp_path)), nprocs=world, start_method="spawn", join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world))
    for s in range(2):
        torch.testing.assert_close(r0[s]["hist"], r1[s]["hist"], rtol=0, atol=0)
        torch.testing.assert_close(r0[s]["scale"], r1[s]["scale"], rtol=0, atol=0)
        want = max(r0[s]["local_in"], r1[s]["local_in"])
        assert r0[s]["hist"][0, 0].item() == pytest.approx(want, rel=1e-6)
        assert r0[s]["local_in"] != r1[s]["local_in"]
    assert r0[1]["hist"][2, 0] > 0 and r0[1]["hist"][2, 1] > 0  # gradient amaxes of both steps
    assert r0[2]["solo_hist"] == pytest.approx(r0[2]["solo_local"]) and r1[2]["solo_hist"] == pytest.approx(r1[2]["solo_local"])
