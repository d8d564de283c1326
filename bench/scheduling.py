"""Benchmark runs as child processes, a few side by side: what the study (`run_bench.py`), compression
(`compress.py`) and hop-depth (`hop_depth.py`) scripts share. Each run is a fresh process, so its peak memory is its
own, and writes its folder's `log.txt`; the scripts decide what runs next and what a finished run makes possible.

A run holds its folder's lock while it runs, so that a second scheduler started on the same results (a re-run after
a `kill -9`, say) leaves the folder alone; on Linux it dies with the scheduler that started it, by a `kill -9` too."""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

LOCK_FILE = ".lock"
# What `finished` gets for a job left unstarted because another process holds its folder's lock: beyond any exit
# status (0 to 255) or signal (negative).
LOCKED = 256
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


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
        """The line a script's summary gives a failed run: its name, and its exit code and log, or the lock that kept
        it from starting."""
        if returncode == LOCKED:
            return f"{self.name}: not run, another process is training {self.run_dir} (it holds {self.run_dir / LOCK_FILE})"
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
    A job whose folder another process is training is not started: `finished(job, LOCKED)` at once.
    However it ends, an interrupt or a SIGTERM included (background jobs of a shell ignore SIGINT), and on Linux a
    SIGKILL too, no run is left training unseen: a folder without its result reruns."""
    running: dict[Job, subprocess.Popen] = {}
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        while True:
            while len(running) < jobs and (job := next_job()) is not None:
                if (process := _start(job)) is None:
                    finished(job, LOCKED)
                else:
                    running[job] = process
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


def _start(job: Job) -> subprocess.Popen | None:
    """`job`'s process, holding its folder's lock; None, the folder's log untouched, while another process holds it."""
    job.run_dir.mkdir(parents=True, exist_ok=True)
    lock = _lock(job.run_dir / LOCK_FILE)
    if lock is None:
        return None
    with lock, open(job.run_dir / "log.txt", "w") as log:
        command, env = _dying_with_this_process(job.command), {**os.environ, **job.env}
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, pass_fds=(lock.fileno(),))


def _lock(path: Path) -> IO | None:
    """`path` open and exclusively locked, or None while another process holds it. Passed on to a run's process, the
    open file keeps the lock for as long as that process (or one it forked) lives, and the system drops it when the
    last of them ends, by a `kill -9` too: a lock is never left stale. The file stays, empty, and is not committed."""
    lock = open(path, "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    return lock


def _dying_with_this_process(command: list[str]) -> list[str]:
    """On Linux, `command` started through this file (`_exec_dying_with`), so that it ends when this process does:
    a scheduler killed by SIGKILL runs no clean-up of its own, and its runs would otherwise train on unseen."""
    if sys.platform != "linux":
        return command
    return [sys.executable, str(Path(__file__).resolve()), str(os.getpid()), *command]


def _exec_dying_with(parent: int, command: list[str]) -> None:
    """Become `command`, with the kernel asked to SIGKILL it when its parent ends (the request outlives `exec`); a
    parent that is no longer `parent` ended while this process started, so it ends here instead."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        sys.exit(f"not run: its scheduler (process {parent}) ended while it started: {command}")
    os.execvp(command[0], command)


if __name__ == "__main__":
    _exec_dying_with(int(sys.argv[1]), sys.argv[2:])
