"""Rank-sharded samplers (one global permutation; the ranks' batch k together is one process's batch k;
evaluation items each once) and the PredictionWriter: ids, order, formats, and gathering across two
real DDP processes (gloo) into the same file as one process writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import DistributedSampler

from mmte.data import collate_batch
from mmte.training.data import TableDataModule, eval_sampler, train_sampler

ROOT = Path(__file__).resolve().parents[2]


def test_sharded_training_batches_equal_one_process_batches():
    n, global_batch, replicas = 60, 12, 3
    one = list(train_sampler(n, seed=4))
    ranks = [list(train_sampler(n, seed=4, num_replicas=replicas, rank=r)) for r in range(replicas)]
    per_rank = global_batch // replicas
    for k in range(n // global_batch):
        together = sorted(i for r in ranks for i in r[k * per_rank : (k + 1) * per_rank])
        assert together == sorted(one[k * global_batch : (k + 1) * global_batch])
    for epoch in (1, 2):  # set_epoch reshuffles every rank the same way as one process
        s = train_sampler(n, seed=4, num_replicas=2, rank=1)
        s.set_epoch(epoch)
        ref = train_sampler(n, seed=4)
        ref.set_epoch(epoch)
        assert list(s) == list(ref)[1::2]
    odd = [list(train_sampler(7, seed=0, num_replicas=2, rank=r)) for r in range(2)]
    assert len(odd[0]) == len(odd[1]) == 4 and set(odd[0]) | set(odd[1]) == set(range(7))  # padded with the permutation's start
    cut = [list(train_sampler(7, seed=0, num_replicas=2, rank=r, drop_last=True)) for r in range(2)]
    assert len(cut[0]) == len(cut[1]) == 3
    shards = [list(eval_sampler(11, 3, r)) for r in range(3)]
    assert sorted(i for s in shards for i in s) == list(range(11)) and shards[2] == [2, 5, 8]


def _table(tmp_path, n=23) -> str:
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"x": rng.normal(size=n), "z": rng.normal(size=n), "c": rng.choice(["u", "v", "w"], n), "y": rng.choice(["a", "b", "c"], n)})
    p = tmp_path / "rows.csv"
    df.to_csv(p, index=False)
    return str(p)


def test_datamodule_shards_by_the_strategy_ranks(tmp_path):
    dm = TableDataModule(_table(tmp_path), label_column="y", val_fraction=0.0, predict=_table(tmp_path), batch_size=4, eval_batch_size=5)
    dm.trainer = SimpleNamespace(strategy=SimpleNamespace(world_size=2, distributed_sampler_kwargs={"num_replicas": 2, "rank": 1}))
    train, pred = dm.train_dataloader(), dm.predict_dataloader()
    assert isinstance(train.sampler, DistributedSampler) and (train.sampler.num_replicas, train.sampler.rank) == (2, 1)
    assert list(pred.sampler) == list(range(1, 23, 2))
    assert [b["index"].tolist() for b in pred] == [[1, 3, 5, 7, 9], [11, 13, 15, 17, 19], [21]]
    dm.trainer = None
    assert list(dm.predict_dataloader().sampler) == list(range(23))


def _module_and_weights(dm, tmp_path) -> tuple[object, str]:
    from mmte.training.module import MMTEModule

    torch.manual_seed(0)
    m = MMTEModule({"tabular": {"name": "tabular"}}, "tiny", {"y": {"name": "classification", "pool": "cls"}}, freeze="none", predict_dtype="fp32", data_info=dm.model_info)
    m.configure_model()
    path = tmp_path / "weights.pt"
    torch.save(m.state_dict(), path)
    return m, str(path)


def _predict(module, dm, output: str) -> None:
    from lightning.pytorch import Trainer

    from mmte.training.callbacks import PredictionWriter

    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[PredictionWriter(output, print_rows=0)], default_root_dir=str(Path(output).parent))
    trainer.predict(module, datamodule=dm, return_predictions=False)


def test_writer_one_process_ids_order_and_formats(tmp_path):
    src = _table(tmp_path)
    dm = TableDataModule(src, label_column="y", val_fraction=0.0, predict=src, eval_batch_size=5)
    module, _ = _module_and_weights(dm, tmp_path)
    _predict(module, dm, str(tmp_path / "p.csv"))
    rows = pd.read_csv(tmp_path / "p.csv", keep_default_na=False)
    assert list(rows.columns) == ["id", "pred", "prob", "target"] and rows["id"].tolist() == list(range(23))
    dm.setup("predict")
    batch = collate_batch([dm.datasets["predict"][i] for i in range(23)], dm.collates)
    module.eval()
    with torch.no_grad():
        prob = module.model(batch)["y"].softmax(-1)
    assert rows["pred"].tolist() == [dm.class_names[i] for i in prob.argmax(-1).tolist()]  # independent forward pass
    np.testing.assert_allclose(rows["prob"].to_numpy(), prob.max(-1).values.numpy(), rtol=0, atol=2e-6)
    assert rows["target"].tolist() == pd.read_csv(src)["y"].tolist()
    _predict(module, dm, str(tmp_path / "p.json"))
    js = json.loads((tmp_path / "p.json").read_text())
    assert [r["pred"] for r in js] == rows["pred"].tolist() and js[0].keys() == {"id", "pred", "prob", "target"}
    _predict(module, dm, str(tmp_path / "p.parquet"))
    assert pd.read_parquet(tmp_path / "p.parquet")["pred"].tolist() == rows["pred"].tolist()
    _predict(module, dm, str(tmp_path / "p.npz"))
    z = np.load(tmp_path / "p.npz")
    assert z["pred"].tolist() == rows["pred"].tolist() and z["id"].tolist() == [str(i) for i in range(23)]


def test_writer_refuses_arrays_in_csv_and_defaults_to_npz(tmp_path):
    """A forecast (an array per item) does not fit a CSV cell: asking for .csv is refused with the fix, and
    without an output the writer picks predictions.npz in the run folder, holding the arrays."""
    from lightning.pytorch import LightningModule, Trainer

    from mmte.training.callbacks import PredictionWriter

    class Forecaster(LightningModule):
        def predict_step(self, batch, batch_idx):
            return {"forecast": {"value": batch[0]}}

    values = torch.randn(2, 96, 7)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(values), batch_size=2)

    def predict(output):
        trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                          callbacks=[PredictionWriter(output, print_rows=0)], default_root_dir=str(tmp_path))
        trainer.predict(Forecaster(), loader, return_predictions=False)

    with pytest.raises(ValueError) as e:
        predict(str(tmp_path / "f.csv"))
    assert str(e.value) == ("predictions ['value'] are arrays of shape (96, 7) per item and do not fit CSV cells; write them to "
                            "--prediction_writer.output predictions.npz (or .parquet / .json)")
    assert not (tmp_path / "f.csv").exists()
    predict(None)
    z = np.load(tmp_path / "predictions.npz")
    assert z["id"].tolist() == [0, 1]
    np.testing.assert_array_equal(z["value"], values.numpy())
    with pytest.raises(ValueError, match=r"^prediction output must end in \.csv, \.parquet, \.json, \.npz; got 'p\.txt'$"):
        PredictionWriter("p.txt")


DDP_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from lightning.pytorch import Trainer
    from mmte.training.callbacks import PredictionWriter
    from mmte.training.data import TableDataModule
    from mmte.training.module import MMTEModule

    src, weights, out = sys.argv[1:4]
    dm = TableDataModule(src, label_column="y", val_fraction=0.0, predict=src, eval_batch_size=5)
    m = MMTEModule({"tabular": {"name": "tabular"}}, "tiny", {"y": {"name": "classification", "pool": "cls"}}, freeze="none", predict_dtype="fp32", data_info=dm.model_info)
    m.configure_model()
    m.load_state_dict(torch.load(weights, weights_only=True))
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[PredictionWriter(out, print_rows=0)])
    trainer.predict(m, datamodule=dm, return_predictions=False)
    """
)


@pytest.mark.slow
def test_writer_gathers_two_ddp_ranks_into_one_ordered_file(tmp_path):
    """23 rows, 2 ranks, batches of 5: ranks hold 12 and 11 rows; the file equals one process's, row for row."""
    src = _table(tmp_path)
    dm = TableDataModule(src, label_column="y", val_fraction=0.0, predict=src, eval_batch_size=5)
    module, weights = _module_and_weights(dm, tmp_path)
    _predict(module, dm, str(tmp_path / "one.csv"))
    script = tmp_path / "ddp_predict.py"
    script.write_text(DDP_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    r = subprocess.run([sys.executable, str(script), src, weights, str(tmp_path / "two.csv")], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    one = pd.read_csv(tmp_path / "one.csv", keep_default_na=False)
    two = pd.read_csv(tmp_path / "two.csv", keep_default_na=False)
    assert two["id"].tolist() == list(range(23))  # every row once, in input order
    assert two[["id", "pred", "target"]].equals(one[["id", "pred", "target"]])
    np.testing.assert_allclose(two["prob"].to_numpy(), one["prob"].to_numpy(), rtol=0, atol=2e-6)


DDP_FIT_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    from lightning.pytorch import Callback, Trainer
    from mmte.training.data import TableDataModule
    from mmte.training.module import MMTEModule

    src, out, devices, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

    class Record(Callback):
        def __init__(self):
            self.seen = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.seen.append([trainer.current_epoch, batch_idx, batch["index"].tolist()])

        def on_train_end(self, trainer, pl_module):
            with open(f"{out}.{trainer.global_rank}.json", "w") as f:
                json.dump(self.seen, f)

    dm = TableDataModule(src, label_column="y", val_fraction=0.0, batch_size=batch, seed=3)
    m = MMTEModule({"tabular": {"name": "tabular"}}, "tiny", {"y": {"name": "classification", "pool": "cls"}}, freeze="none", predict_dtype="fp32", data_info=dm.model_info)
    kw = dict(strategy="ddp") if devices > 1 else {}
    trainer = Trainer(accelerator="cpu", devices=devices, max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, limit_val_batches=0, callbacks=[Record()], **kw)
    trainer.fit(m, datamodule=dm)
    """
)


@pytest.mark.slow
def test_ddp_training_batches_are_one_process_batches(tmp_path):
    """Lightning keeps the DataModule's own sharded sampler under DDP (it is a DistributedSampler): with a
    per-rank batch of 4 on 2 ranks, step k's two batches together are one process's batch k of 8, every epoch."""
    src = _table(tmp_path, n=40)
    script = tmp_path / "ddp_fit.py"
    script.write_text(DDP_FIT_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    r = subprocess.run([sys.executable, str(script), src, str(tmp_path / "seen2"), "2", "4"], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    import runpy

    argv = sys.argv
    try:  # the same script in this process, one device, the global batch of 8
        sys.argv = [str(script), src, str(tmp_path / "seen1"), "1", "8"]
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
    one = json.loads((tmp_path / "seen1.0.json").read_text())
    ranks = [json.loads((tmp_path / f"seen2.{r}.json").read_text()) for r in range(2)]
    assert len(one) == len(ranks[0]) == len(ranks[1]) == 10  # 2 epochs x 5 steps
    for (e, k, ids), a, b in zip(one, *ranks):
        assert a[:2] == b[:2] == [e, k]
        assert sorted(a[2] + b[2]) == sorted(ids), (e, k)
    assert one[0][2] != one[5][2]  # epochs are reshuffled


def test_limit_predict_batches_writes_the_predicted_rows_only(tmp_path):
    """``--trainer.limit_predict_batches`` asks for part of the data: the file holds those rows, by id."""
    import csv

    from mmte.cli import main

    out = tmp_path / "p.csv"
    quick = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
    assert main(["predict", "--config", str(quick), "--config", str(quick.parents[1] / "configs" / "encoders" / "tiny.yaml"),
                 "--trainer.limit_predict_batches", "1", "--data.init_args.eval_batch_size", "16",
                 "--trainer.default_root_dir", str(tmp_path), "--prediction_writer.output", str(out), "--precision", "32-true"]) == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 16
