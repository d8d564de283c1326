"""Benchmark runs as child processes, a few side by side: what the study (`run_bench.py`), compression
(`compress.py`) and hop-depth (`hop_depth.py`) scripts share. Each run is a fresh process (a forked one, below, for
runs of seconds), so its peak memory is its own, and writes its folder's `log.txt`; the scripts decide what runs
next and what a finished run makes possible.

A run holds its folder's lock while it runs, so that a second scheduler started on the same results (a re-run after
a `kill -9`, say) leaves the folder alone; on Linux it dies with the scheduler that started it, by a `kill -9` too.

Forked runs. Importing torch, transformers, peft and datasets costs a fresh process about 5 seconds of one core:
nothing beside a run of minutes, most of a smoke test's run of seconds. A job marked `forked` therefore starts from
a *template*: one process per interpreter, script and environment (the job's own, so that what a library reads from
it at import, `OMP_NUM_THREADS` included, is what a fresh run would have read) that has imported the script's
modules (run as a module, not as `__main__`, so its work must sit under `if __name__ == "__main__"`) and forks a
child per run. The child is the run its command would have started: the script run as `__main__` with the command's
flags, its output in `log.txt`, its folder's lock (passed to the template over a socket), ending as the interpreter
ends a script; it dies with the template, which dies with the scheduler. Linux only: elsewhere a forked job runs
fresh. What differs: its process peak starts from the template's pages (as a fresh process's does once it has
imported the same modules), not from its own imports; so a memory run never forks."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

LOCK_FILE = ".lock"
# What marks a run finished: each script writes it last, whole (`write_complete`), and a re-run skips its run.
RESULT_FILE = "result.json"
# What `finished` gets for a job left unstarted because another process holds its folder's lock: beyond any exit
# status (0 to 255) or signal (negative).
LOCKED = 256
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
MESSAGE_BYTES = 1 << 16  # a template's request or report, one JSON line


@dataclass(eq=False)
class Job:
    """One run: `command` in a child process, its output in `run_dir / "log.txt"`, `env` added to the environment;
    `payload` is the script's own description of it (a study `RunSpec`, a compression row and seed, ...)."""

    name: str
    run_dir: Path
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    payload: Any = None
    # Started from a template that imported the script once (the module's docstring); `command` is then
    # `[python, script, *flags]`. For runs of seconds; never for a run whose process peak is measured.
    forked: bool = False

    @property
    def result_file(self) -> Path:
        """The file whose presence marks the run finished (`RESULT_FILE`, written whole by `write_complete`). Checked
        again once the folder's lock is held: a second scheduler on the same results may have finished the run since
        this one queued it, and it is then not rerun."""
        return self.run_dir / RESULT_FILE

    def failure(self, returncode: int) -> str:
        """The line a script's summary gives a failed run: its name, and its exit code and log, or the lock that kept
        it from starting."""
        if returncode == LOCKED:
            return f"{self.name}: not run, another process is training {self.run_dir} (it holds {self.run_dir / LOCK_FILE})"
        return f"{self.name} (exit code {returncode}): {self.run_dir / 'log.txt'}"


def write_complete(path: Path, record: dict) -> None:
    """Write `record` as JSON to `path` whole or not at all: a run's result file is what marks it finished."""
    write_whole(path, json.dumps(record, indent=2))


def write_whole(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all, so that a reader (another lane, a report) never sees part of it
    and a kill leaves the former file; the temporary file is this process's own, for two lanes writing one file."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def leave_out_of_progress(progress: Any, runs: int, finished_before: int) -> None:
    """Take `runs` that an earlier invocation finished out of the bar `progress` (a tqdm), naming the
    `finished_before` so far in its postfix: counted as done, 60 runs skipped in a second would promise the rest at a
    second each, where the bar's rate and time left should be this invocation's."""
    progress.total -= runs
    progress.set_postfix_str(f"{finished_before} finished before")


def single_run_command(script: str | Path, argument: str) -> list[str]:
    """`script` again, with this process's own flags and `--single_run argument`: one run of its plan."""
    return [sys.executable, str(script), *sys.argv[1:], "--single_run", argument]


def run_jobs(next_job: Callable[[], Job | None], finished: Callable[[Job, int], None], jobs: int) -> None:
    """Start `next_job()` while fewer than `jobs` run and it has one, call `finished(job, returncode)` as each ends,
    until nothing runs and `next_job()` has nothing left (it may return None while it waits for a running job).
    A job whose folder another process is training is not started: `finished(job, LOCKED)` at once.
    However it ends, an interrupt or a SIGTERM included (background jobs of a shell ignore SIGINT), and on Linux a
    SIGKILL too, no run is left training unseen: a folder without its result reruns."""
    running: dict[Job, subprocess.Popen | ForkedRun] = {}
    templates: dict[tuple, Template] = {}
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        while True:
            while len(running) < jobs and (job := next_job()) is not None:
                if isinstance(process := _start(job, templates), int):
                    finished(job, process)  # LOCKED, or 0: finished meanwhile by another process
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
        for template in templates.values():
            template.close()
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, frame) -> None:
    sys.exit(128 + signum)  # raises SystemExit here, so that `run_jobs` ends its children on the way out


def _start(job: Job, templates: dict[tuple, Template]) -> subprocess.Popen | ForkedRun | int:
    """`job`'s process, holding its folder's lock; else, the folder's log untouched, `LOCKED` while another process
    holds the lock, or 0 when another process finished the run meanwhile (its `result_file` is there). A forked
    job's template is started with the first job of its script and environment."""
    job.run_dir.mkdir(parents=True, exist_ok=True)
    lock = _lock(job.run_dir / LOCK_FILE)
    if lock is None:
        return LOCKED
    if job.result_file.is_file():
        lock.close()
        return 0
    env = {**os.environ, **job.env}
    with lock:
        if job.forked and sys.platform == "linux":  # macOS's system libraries are not fork-safe once loaded
            key = (*job.command[:2], tuple(sorted(env.items())))
            if key not in templates:
                templates[key] = Template(*job.command[:2], env)
            return templates[key].start(job.command, job.run_dir / "log.txt", lock)
        with open(job.run_dir / "log.txt", "w") as log:
            command = _dying_with_this_process(job.command)
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
    """Become `command`, dying with `parent` (`_die_with`; the request outlives `exec`)."""
    _die_with(parent, command)
    os.execvp(command[0], command)


def _die_with(parent: int, what) -> None:
    """Ask the kernel to SIGKILL this process when its parent ends; a parent that is no longer `parent` ended while
    this process started, so it ends here instead."""
    if sys.platform != "linux":
        return
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        sys.exit(f"not run: its scheduler (process {parent}) ended while it started: {what}")


class Template:
    """A process that imported `script`'s modules under `env` and forks a run per `start` (the module's docstring).
    If it ends (an interrupt sent to the whole process group, say), its runs ended with it: they report -SIGKILL."""

    def __init__(self, python: str, script: str, env: dict[str, str]) -> None:
        self.channel, theirs = socket.socketpair()
        command = _dying_with_this_process([python, str(Path(__file__).resolve()), "--template", str(theirs.fileno()), script])
        self.process = subprocess.Popen(command, env=env, pass_fds=(theirs.fileno(),), stdout=subprocess.DEVNULL)
        theirs.close()
        self.buffer = b""
        self.returncodes: dict[int, int] = {}  # runs that ended and that no `ForkedRun.poll` has collected yet
        self.ended = False

    def start(self, command: list[str], log: Path, lock: IO) -> ForkedRun:
        request = {"argv": command[1:], "log": str(log)}
        try:
            socket.send_fds(self.channel, [json.dumps(request).encode() + b"\n"], [lock.fileno()])
        except OSError:
            self.ended = True
        while (message := self._message(wait=True)) is not None and "started" not in message:
            self._ended(message)
        if message is None:
            raise RuntimeError(f"the template of the forked runs of {command[1]} ended (exit code {self.process.wait()})")
        return ForkedRun(message["started"], self)

    def collect(self) -> None:
        """Note, without waiting, the runs the template has seen end."""
        while (message := self._message(wait=False)) is not None:
            self._ended(message)

    def _ended(self, message: dict) -> None:
        self.returncodes[message["pid"]] = message["returncode"]

    def _message(self, wait: bool) -> dict | None:
        """The template's next report; None if there is none yet (`wait=False`) or the template has ended."""
        while b"\n" not in self.buffer:
            if self.ended or (not wait and not select.select([self.channel], [], [], 0)[0]):
                return None
            try:
                chunk = self.channel.recv(MESSAGE_BYTES)
            except ConnectionResetError:
                chunk = b""
            self.buffer += chunk
            self.ended = not chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        self.channel.close()  # the template ends when its socket does, and ends its runs
        self.process.wait()


class ForkedRun:
    """A run forked by a `Template`: the part of `subprocess.Popen` that `run_jobs` uses."""

    def __init__(self, pid: int, template: Template) -> None:
        self.pid, self.template, self.returncode = pid, template, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.template.collect()
            self.returncode = self.template.returncodes.pop(self.pid, -signal.SIGKILL if self.template.ended else None)
        return self.returncode

    def terminate(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # ended since
                os.kill(self.pid, signal.SIGTERM)

    def wait(self) -> int:
        while self.poll() is None:
            select.select([self.template.channel], [], [], 0.5)
        return self.returncode


def _serve(channel: socket.socket, script: str) -> dict | None:
    """The template: import `script`'s modules, then fork a run per request and report when each ends, until the
    scheduler closes the socket; then end (and reap) the runs still going, and return None. Returns in each forked
    child too, with its request (outside every handler here, so that the run ends as a fresh interpreter would)."""
    sys.path[0] = str(Path(script).resolve().parent)  # as `python script` has it
    runpy.run_path(script, run_name="__template__")  # the module's imports, not its `main()`
    running: set[int] = set()
    try:
        while True:
            if select.select([channel], [], [], 0.2)[0]:
                request, fds = _request(channel)
                if not request:
                    return
                template = os.getpid()
                pid = os.fork()
                if pid == 0:
                    channel.close()
                    running.clear()  # the other runs are the template's to end
                    return {**json.loads(request), "template": template}
                os.close(fds[0])  # the run holds the lock now
                running.add(pid)
                _report(channel, {"started": pid})
            for pid in list(running):
                ended, status = os.waitpid(pid, os.WNOHANG)
                if ended:
                    running.discard(pid)
                    _report(channel, {"pid": pid, "returncode": os.waitstatus_to_exitcode(status)})
    except BrokenPipeError:  # the scheduler is gone
        return None
    finally:
        for pid in running:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)  # so that its folder's lock is released before the template ends


def _report(channel: socket.socket, message: dict) -> None:
    channel.sendall(json.dumps(message).encode() + b"\n")


def _request(channel: socket.socket) -> tuple[bytes, list[int]]:
    """One request line and the lock it passes; empty once the scheduler has closed the socket. A long line comes in
    several reads (the one that carries the descriptor ends at the first part)."""
    request, fds, _, _ = socket.recv_fds(channel, MESSAGE_BYTES, 1)
    while request and not request.endswith(b"\n") and (more := channel.recv(MESSAGE_BYTES)):
        request += more
    return request, fds


def _forked_run(script: str, request: dict) -> None:
    """In the child the template forked: the run its command would have started, in the environment the template
    was started with (the job's), ending as `python script` would (exit status, traceback, atexit, flushed output)."""
    _die_with(request["template"], request["argv"])
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    sys.argv = request["argv"]
    runpy.run_path(script, run_name="__main__")
    sys.exit(0)


if __name__ == "__main__":
    if sys.argv[1] == "--template":
        if (forked := _serve(socket.socket(fileno=int(sys.argv[2])), sys.argv[3])) is not None:
            _forked_run(sys.argv[3], forked)
    else:
        _exec_dying_with(int(sys.argv[1]), sys.argv[2:])
