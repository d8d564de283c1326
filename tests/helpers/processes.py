"""Several processes on CPU: `accelerate launch` as the README tells users (`launch`), and torchrun on two gloo
processes (`run_on_two_ranks`); the scripts they run are in tests/scripts."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
# The README's command for a CPU-only machine (`accelerate launch ...`), run by this Python, so that the suite
# passes however it is invoked (a virtual environment that is not activated has no `accelerate` on PATH); `launch`
# adds a free port.
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]  # fmt: skip


def free_port() -> int:
    """A port no process listens on: the suite runs in two pytest workers (pyproject.toml), so two launches may
    start at once, and on accelerate's default port the second would find the first's."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(script_and_args, cwd):
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [*LAUNCH, "--main_process_port", str(free_port()), *script_and_args]
    completed = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return completed


def run_on_two_ranks(script: str | Path, output_dir: Path, timeout: float) -> list[dict]:
    """Run tests/scripts/`script` (or the script at an absolute path) under torchrun on 2 gloo processes and load what
    each rank saved. A run past `timeout` (blocked ranks) fails the test; SIGTERM makes torchrun end its workers, which
    run in sessions of their own that killing torchrun alone would leave behind."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    # `--standalone`: a free port of its own, as another pytest worker may be launching processes too.
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(REPO / "tests" / "scripts" / script), str(output_dir)]  # fmt: skip
    with subprocess.Popen(command, cwd=output_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:  # fmt: skip
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.terminate()
            stdout, stderr = process.communicate(timeout=60)
            pytest.fail(f"{script} still ran after {timeout} s: {stdout[-3000:]}{stderr[-3000:]}")
    assert process.returncode == 0, stdout[-3000:] + stderr[-3000:]
    return [torch.load(output_dir / f"rank{rank}.pt") for rank in (0, 1)]
