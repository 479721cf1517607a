"""Run ``mmte fit`` (the real CLI class, in-process) for several argument lists in one launch and write,
per run, the global training loss of every step and the final logged metrics as JSON.

Usage (every rank runs the same list; rank 0 writes OUT)::

    torchrun --nproc_per_node 2 tests/parallel/cli_fit.py OUT.json RUNS.json
    python tests/parallel/cli_fit.py OUT.json RUNS.json            # one process

``RUNS.json``: ``{"name": ["--config", "recipes/quickstart.yaml", ...], ...}``. A run that fails records
``{"error": "<first line>"}`` instead (on every rank, so the launch goes on with the next run).
The step loss is averaged over all ranks: data-parallel replicas hold different samples of one global
batch (their mean is the global batch's loss when they hold equal shares); tensor- and
pipeline-parallel ranks of a replica hold the same value.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

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


def run(args: list[str]) -> dict:
    from mmte.cli import _cli_class

    cb = StepLosses()
    cli = _cli_class()(args=list(args), run=False, trainer_defaults={"callbacks": [LearningRateMonitor(logging_interval="step"), cb]})
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items() if v.numel() == 1}
    ckpt_dir = cli.config.checkpoint.dirpath
    return {"losses": cb.losses, "metrics": metrics, "trainable_abs_sums": cb.trainable,
            "checkpoints": sorted(os.listdir(ckpt_dir)) if ckpt_dir and os.path.isdir(ckpt_dir) else []}


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    out, runs = sys.argv[1], json.loads(open(sys.argv[2]).read())
    results = {}
    for name, args in runs.items():
        try:
            results[name] = run(args)
        except Exception as e:  # noqa: BLE001 - recorded and compared by the test
            if os.environ.get("MMTE_DEBUG"):
                traceback.print_exc()
            results[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
