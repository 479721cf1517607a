"""Streaming a Hugging Face dataset: peak memory does not grow with the dataset, and rows/s against map-style.

Generates a classification table (four float columns, one categorical string column, an integer label;
the label is a function of the numbers) as parquet shards in a temporary folder, at each ``--sizes`` row
count (``--shards`` equal shards each, plus a small validation file), and trains one epoch of the real
``mmte fit`` on it (a subprocess per run, one torch thread) with :class:`~mmte.training.data.HFDataModule`,
the tabular tokenizer, the ``tiny`` trainable backbone and a classification head:

* ``stream``: ``streaming: true``, the training split read shard by shard through a shuffle buffer;
* ``map``: the same files map-style (class map and scalers fitted on the whole split, the split
  preprocessed once with ``Dataset.map`` into an Arrow cache under the temporary folder, then read by index).

Per run: the process's peak resident memory (``VmHWM`` from ``/proc/self/status``, read by a callback at
the end of training: the peak over the whole process, start-up and data preparation included), the wall
time of the whole command, and the training rows per second (rows of the epoch over the time from the
epoch's start to its last batch; map-style preprocessing is outside it and inside the command's time).
The claim checked: the peak of the largest streamed set is within 100 MB of the smallest's.

``--limit-batches N`` trains ``N`` batches of every run instead of whole epochs (the same rows at every
size), for a machine on which a full epoch of the largest set takes too long; the memory claim is then
that the stream never holds the dataset, which a map-style run of the same size shows by contrast.

    python bench/hf_stream.py                                    # 100,000 and 2,000,000 rows, 20 shards each
    python bench/hf_stream.py --limit-batches 98 --modes stream,map --update-doc
    python bench/hf_stream.py --dry-run                          # tiny sizes: checks the script runs
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lightning.pytorch import Callback

from bench import _doc

FEATURES = ["f0", "f1", "f2", "f3", "cat"]
MODES = ("stream", "map")
LIMIT_MB = 100.0


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    return 0


class Probe(Callback):
    """Writes the process's peak RSS (``VmHWM``), its current RSS and the training epoch's rows/s to ``out`` (JSON).

    Args:
        out: the JSON file written at the end of training (rank 0).
    """

    def __init__(self, out: str):
        self.out, self.rows, self.t0, self.seconds = out, 0, None, 0.0

    def on_train_epoch_start(self, trainer, pl_module):
        self.t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rows += int(batch["label"].shape[0])
        self.seconds = time.perf_counter() - self.t0

    def on_train_end(self, trainer, pl_module):
        if trainer.global_rank == 0:
            Path(self.out).write_text(json.dumps({"peak_rss_mb": _status_kib("VmHWM") / 1024, "rss_mb": _status_kib("VmRSS") / 1024,
                                                  "rows": self.rows, "train_seconds": self.seconds,
                                                  "rows_per_s": self.rows / self.seconds if self.seconds else 0.0}))


def write_shards(d: Path, rows: int, shards: int, val_rows: int = 2048, seed: int = 0) -> Path:
    """``rows`` rows in ``shards`` parquet files ``train-<i>.parquet`` and ``val_rows`` in ``validation.parquet``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    bounds = np.linspace(0, rows, shards + 1).astype(int)
    parts = [(f"train-{i:03d}.parquet", int(b - a)) for i, (a, b) in enumerate(itertools.pairwise(bounds))] + [("validation.parquet", val_rows)]
    cats = np.array(["red", "green", "blue", "grey", "black"])
    for name, n in parts:
        x = rng.normal(size=(n, 4)).astype(np.float32)
        label = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
        cols = {f"f{j}": x[:, j] for j in range(4)}
        cols["cat"] = cats[rng.integers(0, len(cats), n)]
        cols["label"] = label
        pq.write_table(pa.table(cols), d / name)
    return d


def config(d: Path, streaming: bool, batch: int, limit: int) -> dict:
    trainer = {"max_epochs": 1, "devices": 1, "num_sanity_val_steps": 0, "limit_val_batches": 0, "logger": False,
               "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False}
    if limit:
        trainer["limit_train_batches"] = limit
    return {
        "seed_everything": 0,
        "precision": "32-true",
        "trainer": trainer,
        "model": {"tokenizers": {"tabular": {"name": "tabular"}}, "backbone": "tiny", "backbone_weights": None, "freeze": "none",
                  "heads": {"label": {"name": "classification", "pool": "cls"}}, "lr": 1.0e-3},
        "data": {"class_path": "mmte.training.data.HFDataModule",
                 "init_args": {"path": "parquet", "data_files": {"train": str(d / "train-*.parquet"), "validation": str(d / "validation.parquet")},
                               "columns": {"tabular": FEATURES}, "label_column": "label", "streaming": streaming,
                               "batch_size": batch, "seed": 0}},
    }


def run_one(work: Path, d: Path, mode: str, batch: int, limit: int, threads: int) -> dict:
    import yaml

    name = f"{d.name}-{mode}"
    cfg, out = work / f"{name}.yaml", work / f"{name}.json"
    cfg.write_text(yaml.safe_dump(config(d, mode == "stream", batch, limit)))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               HF_DATASETS_CACHE=str(work / "hf-cache" / name))  # a fresh map-style cache per run, removed with the folder
    cmd = [sys.executable, "-m", "mmte", "fit", "--config", str(cfg), "--trainer.default_root_dir", str(work / name),
           "--trainer.callbacks+=bench.hf_stream.Probe", "--trainer.callbacks.out", str(out)]
    t = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t
    if p.returncode != 0 or not out.exists():
        raise RuntimeError(f"{name}: mmte fit exited {p.returncode}:\n{p.stderr[-3000:]}")
    return {**json.loads(out.read_text()), "wall_s": wall}


def doc_table(res: dict) -> str:
    rows = []
    for r in res["runs"]:
        rows.append([f"{r['size']:,}", r["mode"], f"{r['rows']:,}", f"{r['peak_rss_mb']:.0f}", f"{r['rows_per_s']:,.0f}", f"{r['wall_s']:.0f}"])
    table = _doc.md_table(["dataset rows", "read", "rows trained", "peak RSS (MB)", "train rows/s", "command wall (s)"], rows,
                          align="rlrrrr")
    notes = [(f"Batch {res['batch']}, {res['shards']} parquet shards per size, one torch thread, the `tiny` backbone. The runs "
             "follow each other (not interleaved): on a loaded machine the rows/s of two runs also differ by the load's changes.")]
    if res["limit"]:
        notes.append(f"Every run trains the first {res['limit']} batches (`limit_train_batches`), the same rows at every size: "
                     "a whole epoch of the largest set took too long on this machine. The memory figures then say that the "
                     "stream never holds the dataset; the map-style rows show what holding it costs.")
    for mode, verdict in res["growth"].items():
        notes.append(f"Peak RSS growth, {mode}, {verdict['big']:,} vs {verdict['small']:,} rows: {verdict['mb']:+.0f} MB"
                     + (f" (limit {LIMIT_MB:.0f} MB: {'met' if verdict['mb'] <= LIMIT_MB else 'NOT met'})." if mode == "stream" else "."))
    for size, ratio in res["speed"].items():
        notes.append(f"Streaming / map-style training rows/s at {int(size):,} rows: {ratio:.2f}x.")
    return table + "\n\n" + "\n".join(f"- {n}" for n in notes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 2_000_000], help="rows of each generated dataset")
    ap.add_argument("--shards", type=int, default=20)
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {MODES}")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--limit-batches", type=int, default=0, help="train this many batches per run instead of one epoch (0: the epoch)")
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each run")
    ap.add_argument("--workdir", default=None, help="where the shards and runs go (default: a temporary folder, removed)")
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "hf_stream.json"))
    ap.add_argument("--dry-run", action="store_true", help="sizes 2,048 and 8,192, 4 shards, batch 256")
    _doc.add_argument(ap, "hf-stream")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        raise SystemExit(f"--modes {args.modes!r}: expected a comma-separated subset of {MODES}")
    if args.dry_run:
        args.sizes, args.shards, args.batch = [2048, 8192], 4, 256
    sizes = sorted(args.sizes)
    res = {"batch": args.batch, "shards": args.shards, "limit": args.limit_batches, "runs": [], "growth": {}, "speed": {}}
    with tempfile.TemporaryDirectory(prefix="mmte-hf-stream-", dir=args.workdir) as tmp:
        work = Path(tmp)
        for size in sizes:
            d = write_shards(work / f"rows{size}", size, args.shards)
            for mode in modes:
                r = {"size": size, "mode": mode, **run_one(work, d, mode, args.batch, args.limit_batches, args.threads)}
                print(json.dumps(r), flush=True)
                res["runs"].append(r)
    by = {(r["size"], r["mode"]): r for r in res["runs"]}
    for mode in modes:
        if len(sizes) > 1:
            small, big = by[(sizes[0], mode)], by[(sizes[-1], mode)]
            res["growth"][mode] = {"small": sizes[0], "big": sizes[-1], "mb": big["peak_rss_mb"] - small["peak_rss_mb"]}
    if set(modes) == set(MODES):
        res["speed"] = {str(s): by[(s, "stream")]["rows_per_s"] / by[(s, "map")]["rows_per_s"] for s in sizes}
    load = os.getloadavg()[0]
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    res["machine"] = _doc.machine_line(note=f"{args.threads} torch thread(s) per run; uptime at the end: {uptime}")
    res["command"] = _doc.command_line("bench/hf_stream.py")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(res, indent=1))
    print(doc_table(res))
    print(f"load average {load:.2f}")
    if args.update_doc:
        _doc.update_doc("hf-stream", doc_table(res), res["command"], args.update_doc, machine=res["machine"],
                        title="Streaming a Hugging Face dataset: memory and rows/s (`bench/hf_stream.py`)")


if __name__ == "__main__":
    main()
