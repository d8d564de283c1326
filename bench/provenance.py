"""Where a measured number came from: the commit of this repository and the versions of the stack, recorded in
every run record so that runs from other code or versions are never mixed into one table unnoticed."""

from __future__ import annotations

import platform
import subprocess
from importlib.metadata import version
from pathlib import Path

PACKAGES = ("torch", "transformers", "accelerate", "datasets", "peft")


def provenance() -> dict:
    """`commit` (with `+dirty` when the work tree differs from it; None outside git), `python` and `versions`."""
    root = Path(__file__).resolve().parents[1]

    def git(*arguments: str) -> str | None:
        try:
            return subprocess.run(["git", "-C", str(root), *arguments], capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    commit = git("rev-parse", "HEAD")
    if commit is not None and git("status", "--porcelain", "--untracked-files=no"):
        commit += "+dirty"
    return {"commit": commit, "python": platform.python_version(), "versions": {name: version(name) for name in PACKAGES}}
