"""Benchmark runs as child processes, a few side by side: what the study (`run_bench.py`), compression
(`compress.py`) and hop-depth (`hop_depth.py`) scripts share. Each run is a fresh process, so its peak memory is its
own, and writes its folder's `log.txt`; the scripts decide what runs next and what a finished run makes possible."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(eq=False)
class Job:
    """One run: `command` in a child process, its output in `run_dir / "log.txt"`, `env` added to the environment;
    `payload` is the script's own description of it (a study `RunSpec`, a compression row and seed, ...)."""

    name: str
    run_dir: Path
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    payload: Any = None

    def failure(self, returncode: int) -> str:
        """The line a script's summary gives a failed run: its name, exit code and log."""
        return f"{self.name} (exit code {returncode}): {self.run_dir / 'log.txt'}"


def write_complete(path: Path, record: dict) -> None:
    """Write `record` as JSON to `path` whole or not at all: a run's result file is what marks it finished."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(record, indent=2))
    os.replace(temporary, path)


def single_run_command(script: str | Path, argument: str) -> list[str]:
    """`script` again, with this process's own flags and `--single_run argument`: one run of its plan."""
    return [sys.executable, str(script), *sys.argv[1:], "--single_run", argument]


def run_jobs(next_job: Callable[[], Job | None], finished: Callable[[Job, int], None], jobs: int) -> None:
    """Start `next_job()` while fewer than `jobs` run and it has one, call `finished(job, returncode)` as each ends,
    until nothing runs and `next_job()` has nothing left (it may return None while it waits for a running job).
    However it ends, an interrupt or a SIGTERM included (background jobs of a shell ignore SIGINT), no run is left
    training unseen: a folder without its result reruns."""
    running: dict[Job, subprocess.Popen] = {}
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        while True:
            while len(running) < jobs and (job := next_job()) is not None:
                running[job] = _start(job)
            if not running:
                return
            time.sleep(0.5)
            for job in [job for job, process in running.items() if process.poll() is not None]:
                finished(job, running.pop(job).returncode)
    finally:
        for process in running.values():
            process.terminate()
            process.wait()
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, frame) -> None:
    sys.exit(128 + signum)  # raises SystemExit here, so that `run_jobs` ends its children on the way out


def _start(job: Job) -> subprocess.Popen:
    job.run_dir.mkdir(parents=True, exist_ok=True)
    with open(job.run_dir / "log.txt", "w") as log:
        return subprocess.Popen(job.command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **job.env})
