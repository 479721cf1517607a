"""Fit the tiny test model with Lightning + MMTEStrategy under several layouts in one launch; rank 0 writes
each layout's per-step losses (then the validation loss after them) as JSON.

Usage: torchrun --nproc_per_node 2 tests/parallel/lightning_fit.py OUT.json '{"tp2": {"tp": 2}, ...}' [steps]
(every rank fits each layout in turn: one start-up and one process group for all of them).
"""

from __future__ import annotations

import json
import os
import sys

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from tests.parallel._workers import batch, make_model


class TinyModule(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = make_model()
        self.loss_fn = F.cross_entropy
        self.losses: list[float] = []

    def training_step(self, b, i):
        x, y = b
        return F.cross_entropy(self.model(x), y)

    def validation_step(self, b, i):
        x, y = b
        loss = F.cross_entropy(self.model(x), y)
        self.log("val_loss", loss)
        return loss

    def on_train_batch_end(self, outputs, b, i):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(loss))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def data(steps: int) -> DataLoader:
    xs, ys = zip(*(batch(s) for s in range(steps)))
    return DataLoader(TensorDataset(torch.cat(xs), torch.cat(ys)), batch_size=8, shuffle=False)


def reference(steps: int) -> list[float]:
    """Per-step training losses, then the validation loss on batch 0 after the last step."""
    m = make_model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    out = []
    for s in range(steps):
        x, y = batch(s)
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    x, y = batch(0)
    with torch.no_grad():
        out.append(F.cross_entropy(m(x), y).item())
    return out


def main() -> None:
    if os.environ.get("MMTE_FAULT"):
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ["MMTE_FAULT"]), exit=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    out, specs = sys.argv[1], json.loads(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    from mmte.training.strategy import MMTEStrategy

    results = {}
    for name, spec in specs.items():
        trainer = L.Trainer(
            accelerator="cpu",
            devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            strategy=MMTEStrategy(**spec),
            max_steps=steps,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            check_val_every_n_epoch=1,
            default_root_dir=os.path.dirname(out),
            use_distributed_sampler=False,  # every rank (dp=1) reads the same, unshuffled batches as the reference
        )
        module = TinyModule()
        trainer.fit(module, data(steps), data(1))
        if "val_loss" in trainer.callback_metrics:
            module.losses.append(float(trainer.callback_metrics["val_loss"]))  # after the last step
        results[name] = module.losses
    if int(os.environ.get("RANK", "0")) == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    # end the process group the fits started before the interpreter exits (as mmte's fit verbs do): left to
    # interpreter teardown, a rank's gloo threads were once destroyed while joinable, a native abort
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
