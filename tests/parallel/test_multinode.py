"""Beyond one machine: ``mmte fit --trainer.num_nodes 2`` as two "nodes" of one process each on localhost,
started the two ways clusters start jobs: ``torchrun --nnodes 2`` with a c10d rendezvous, and SLURM's
environment variables (what ``srun`` sets for each task). Both train the quickstart (tiny backbone) under
the DDP fragment like one process with the whole batch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ._launch import REPO, launch

DRIVER = str(REPO / "tests" / "parallel" / "cli_fit.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _args(tmp: Path, name: str, batch: int, *extra: str) -> list[str]:
    return ["--config", str(REPO / "recipes" / "quickstart.yaml"), "--config", str(REPO / "configs" / "encoders" / "tiny.yaml"),
            "--precision", "32-true", "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
            "--data.init_args.batch_size", str(batch), "--trainer.default_root_dir", str(tmp / name), *extra]


def _start_two_nodes(tmp: Path, name: str, make_cmd, make_env) -> list[subprocess.Popen]:
    """Start the two "nodes" of one way of launching (they run while the test starts the other way)."""
    spec, out = tmp / f"{name}.json", tmp / f"{name}-out.json"
    nodes = ["--config", str(REPO / "configs" / "parallel" / "ddp.yaml"), "--trainer.num_nodes", "2", "--trainer.devices", "1"]
    spec.write_text(json.dumps({name: _args(tmp, name, 32, *nodes)}))
    procs = []
    for rank in range(2):
        with open(tmp / f"{name}-{rank}.log", "w") as log:  # a file, not a pipe: nobody reads it while it runs
            procs.append(subprocess.Popen(make_cmd(rank, spec, out), cwd=REPO, env=make_env(rank), stdout=log, stderr=subprocess.STDOUT))
    return procs


def _result(tmp: Path, name: str, procs: list[subprocess.Popen]) -> dict:
    for p in procs:
        p.wait(timeout=600)
    logs = [(tmp / f"{name}-{rank}.log").read_text() for rank in range(2)]
    assert all(p.returncode == 0 for p in procs), "\n".join(x[-3000:] for x in logs)
    return json.loads((tmp / f"{name}-out.json").read_text())[name]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_two_nodes_under_torchrun_and_slurm_train_like_one_process(tmp_path):
    base = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    port, slurm_port = _free_port(), _free_port()

    def torchrun_cmd(rank, spec, out):
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
                "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "mmte-test", DRIVER, str(out), str(spec)]

    def slurm_env(rank):
        return dict(base, SLURM_JOB_ID="4242", SLURM_JOB_NAME="mmte", SLURM_NTASKS="2", SLURM_NTASKS_PER_NODE="1", SLURM_NNODES="2",
                    SLURM_PROCID=str(rank), SLURM_LOCALID="0", SLURM_NODEID=str(rank), SLURM_NODELIST="127.0.0.1",
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(slurm_port))

    # the two jobs (on their own ports) and the one-process reference run at the same time: most of a
    # job's time is the rendezvous and start-up, which overlap
    torchrun = _start_two_nodes(tmp_path, "torchrun", torchrun_cmd, lambda rank: base)
    slurm = _start_two_nodes(tmp_path, "slurm", lambda rank, spec, out: [sys.executable, DRIVER, str(out), str(spec)], slurm_env)
    try:
        ref = launch(1, {"one": _args(tmp_path, "one", 64)}, tmp_path, 600)["one"]
        tr, sl = _result(tmp_path, "torchrun", torchrun), _result(tmp_path, "slurm", slurm)
    finally:
        for p in torchrun + slurm:
            if p.poll() is None:
                p.kill()
    assert "error" not in ref, ref

    for name, got in (("torchrun", tr), ("slurm", sl)):
        assert "error" not in got, (name, got)
        assert "last.ckpt" in got["checkpoints"], name
        assert len(got["losses"]) == len(ref["losses"]) == 2  # the second step follows the synchronised first update
        worst = max(abs(a - b) for a, b in zip(got["losses"], ref["losses"]))
        assert worst <= 1e-4, (name, worst, got["losses"], ref["losses"])
