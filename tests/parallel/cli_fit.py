"""Run ``mmte fit`` / ``predict`` (the real CLI class, in-process) for several argument lists in one
launch and write, per run, the global training loss of every step, the final logged metrics and (predict)
the predicted probabilities as JSON.

Usage (every rank runs the same list; rank 0 writes OUT)::

    torchrun --nproc_per_node 2 tests/parallel/cli_fit.py OUT.json RUNS.json
    python tests/parallel/cli_fit.py --world 2 OUT.json RUNS.json  # 2 ranks forked from one import
    python tests/parallel/cli_fit.py OUT.json RUNS.json            # one process

``--world N`` starts the N ranks as torchrun would (the same environment variables, so Lightning sees a
torchelastic launch, and every rank ended when one fails), but forked from this process once it has imported
mmte, Lightning and torch and has run nothing: the tests' launches pay one import (7 CPU-seconds) instead of N
plus torchrun's own. The multi-node test keeps torchrun and SLURM themselves.

``RUNS.json``: ``{"name": ["--config", "recipes/quickstart.yaml", ...], ...}``; an argument list may start
with ``predict`` (default ``fit``) and hold ``--ckpt_path PATH`` and ``--stop_after_epoch N`` (fit: stop
at the end of epoch N, keeping the schedule of the full run). A run that fails records
``{"error": "<first line>"}`` instead (on every rank, so the launch goes on with the next run).
The step loss is averaged over all ranks: data-parallel replicas hold different samples of one global
batch (their mean is the global batch's loss when they hold equal shares); tensor- and
pipeline-parallel ranks of a replica hold the same value.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import LearningRateMonitor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))


class StepLosses(Callback):
    def __init__(self):
        self.losses: list[float] = []
        self.trainable: dict[str, float] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        t = loss.detach().float().reshape(()).clone()
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(t)
            t /= torch.distributed.get_world_size()
        self.losses.append(float(t))

    def on_train_end(self, trainer, pl_module):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(pl_module, options=StateDictOptions(full_state_dict=True))
        trainable = {n for n, p in pl_module.named_parameters() if p.requires_grad}
        mine = {k: float(v.double().abs().sum()) for k, v in sd.items() if k in trainable}
        if torch.distributed.is_initialized():
            parts = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(parts, mine)
            for p in parts:
                mine.update(p)
        self.trainable = mine


class StopAfterEpoch(Callback):
    def __init__(self, epoch: int):
        self.epoch = epoch

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch + 1 >= self.epoch:
            trainer.should_stop = True


class DesyncRNG(Callback):
    """Rank r > 0 draws r extra numbers from torch's global RNG before every training step, so the ranks'
    RNG streams differ from the first step on (what a rank-dependent random op would do)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_rank > 0:
            torch.rand(trainer.global_rank)


def _pop(args: list[str], flag: str) -> str | None:
    if flag in args:
        i = args.index(flag)
        value = args[i + 1]
        del args[i : i + 2]
        return value
    return None


def run(args: list[str]) -> dict:
    from mmte.cli import MMTECLI, single_process_checkpoint

    args = list(args)
    command = args.pop(0) if args and args[0] in ("fit", "predict") else "fit"
    ckpt, stop, desync = _pop(args, "--ckpt_path"), _pop(args, "--stop_after_epoch"), _pop(args, "--desync_rng")
    cb = StepLosses()
    callbacks = [LearningRateMonitor(logging_interval="step"), cb] + ([StopAfterEpoch(int(stop))] if stop else [])
    callbacks += [DesyncRNG()] if desync == "true" else []
    cli = MMTECLI(args=args, run=False, trainer_defaults={"callbacks": callbacks})
    if cli.trainer.world_size == 1:  # as mmte's CLI does: a distributed checkpoint folder is consolidated first
        ckpt = single_process_checkpoint(ckpt, cli.trainer.default_root_dir)
    if command == "predict":
        outs = cli.trainer.predict(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt)
        probs = [o[h]["prob"].tolist() for o in outs for h in o if isinstance(o[h], dict) and "prob" in o[h]]
        return {"probs": [row for batch in probs for row in batch]}
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt)
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items() if v.numel() == 1}
    ckpt_dir = cli.config.checkpoint.dirpath
    return {"losses": cb.losses, "metrics": metrics, "trainable_abs_sums": cb.trainable,
            "checkpoints": sorted(os.listdir(ckpt_dir)) if ckpt_dir and os.path.isdir(ckpt_dir) else []}


def fork_ranks(world: int) -> int | None:
    """Fork ``world`` ranks with torchrun's environment; in a rank: None (go on and run); in this process,
    once every rank ended: the launch's exit status (0, or the first failure; a rank killed by a signal is
    reported as torchrun reports it, ``exitcode  : -N``, and ends the others, as torchrun does)."""
    import signal

    from tests.parallel._dist import free_port

    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
              "GROUP_RANK": "0", "ROLE_WORLD_SIZE": str(world), "TORCHELASTIC_RUN_ID": f"cli-fit-{os.getpid()}"}
    ranks: dict[int, int] = {}
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            os.environ.update(common, RANK=str(rank), LOCAL_RANK=str(rank), ROLE_RANK=str(rank))
            return None
        ranks[pid] = rank
    status = 0
    while ranks:
        pid, raw = os.wait()
        rank = ranks.pop(pid)
        code = os.waitstatus_to_exitcode(raw)
        if code != 0 and status == 0:
            status = code if code > 0 else 1
            print(f"rank {rank} (pid {pid}) failed: exitcode  : {code} ", file=sys.stderr, flush=True)
            for other in ranks:  # the others may wait for the failed rank in a collective: end them
                os.kill(other, signal.SIGKILL)
    return status


def main() -> None:
    faulthandler.enable(all_threads=True)  # a native abort (SIGABRT, SIGSEGV) prints every thread's Python stack
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    argv = sys.argv[1:]
    world = int(argv[1]) if argv[0] == "--world" else 0
    out, runs = argv[-2], json.loads(Path(argv[-1]).read_text())
    # the imported modules' objects live as long as the process: the collector stops scanning them, so
    # the collection between runs (and every automatic one) looks at what the runs made (0.3 s less a run)
    import mmte.cli.app  # noqa: F401 - imported before the freeze (and before forking the ranks)

    gc.freeze()
    if world and (status := fork_ranks(world)) is not None:
        sys.exit(status)
    torch.set_num_threads(1)
    try:
        run_all(out, runs)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    if world:  # a forked rank: end the process group, skip the parent's exit handlers
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        os._exit(0)


def run_all(out: str, runs: dict[str, list[str]]) -> None:
    """Every run of ``runs`` in order; rank 0 writes the results to ``out`` after each."""
    results = {}
    # the process group starts inside the first fit; SLURM launches set SLURM_PROCID, torchrun RANK
    env_rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
    for name, args in runs.items():
        started = time.perf_counter()
        try:
            results[name] = run(args)
            results[name]["wall_s"] = round(time.perf_counter() - started, 2)
        except Exception as e:  # noqa: BLE001 - reported to the test, then the launch ends
            traceback.print_exc()
            results[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
            # the other ranks may wait in a collective of this run forever: record and end the whole launch
            with open(f"{out}.error-{env_rank}", "w") as f:
                json.dump({name: results[name]}, f)
            sys.stdout.flush()
            os._exit(1)
        # the finished run's objects (trainer, model, meshes) are freed here, between two barriers, rather
        # than whenever the collector next runs inside the following run's collectives
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
        gc.collect()
        gc.freeze()  # what survived the run (its results) is not scanned again
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
        rank0 = torch.distributed.get_rank() == 0 if torch.distributed.is_initialized() else env_rank == "0"
        if rank0:  # written after every run, so a later failure keeps the earlier results
            with open(out, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
