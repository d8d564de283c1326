"""Where a measured number came from: the commit of this repository, the versions of the stack and the machine,
recorded in every run record so that runs from other code, versions or machines are never mixed into one table
unnoticed, and a report names the machine that measured its runs."""

from __future__ import annotations

import platform
import subprocess
from collections import defaultdict
from importlib.metadata import version
from pathlib import Path

import torch

PACKAGES = ("torch", "transformers", "accelerate", "datasets", "peft")


def provenance(on_gpu: bool = False) -> dict:
    """`commit` (with `+dirty` when the work tree differs from it; None outside git), `python`, `versions` and
    `hardware`: the GPU a run trained on (`on_gpu`), else this machine's processor and the threads torch uses."""
    commit = git("rev-parse", "HEAD")
    if commit is not None and git("status", "--porcelain", "--untracked-files=no"):
        commit += "+dirty"
    return {
        "commit": commit,
        "python": platform.python_version(),
        "versions": {name: version(name) for name in PACKAGES},
        "hardware": torch.cuda.get_device_name() if on_gpu else f"{processor_name()}, {torch.get_num_threads()} thread(s) per run",
    }


def git(*arguments: str, root: Path = Path(__file__).resolve().parents[1]) -> str | None:
    """A git command's output in the repository at `root` (this one); None outside git (a `git archive` copy) or
    when it fails."""
    try:
        return subprocess.run(["git", "-C", str(root), *arguments], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def processor_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else what `platform` knows of it."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    named = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    return named or platform.processor() or platform.machine() or "unknown CPU"


def hardware(records: list[dict]) -> str:
    """The machines that measured `records`, as recorded in them; records from before the field existed are
    counted as such, beside the machine writing the report, rather than attributed to it."""
    recorded = "; ".join(sorted({record["hardware"] for record in records if "hardware" in record}))
    unrecorded = sum("hardware" not in record for record in records)
    missing = f"{unrecorded} run(s) from before runs recorded their machine (this report was written on {processor_name()})" if unrecorded else ""
    return " and ".join(part for part in (recorded, missing) if part) or "no run has finished yet"


def source(record: dict, with_versions: bool = True) -> str:
    """Which code (and versions) a run record came from, in words; runs from before provenance was recorded say so."""
    if "commit" not in record:
        return "unrecorded (a run from before provenance was recorded)"
    return f"commit {record['commit']}" + (f", {_versions(record)}" if with_versions else "")


def _versions(record: dict) -> str:
    return ", ".join(f"{name} {value}" for name, value in record["versions"].items())


def source_lines(records: list[dict]) -> list[str]:
    """A report's last lines: where its runs came from, and, when from more than one commit or set of versions,
    which runs (label: seeds) came from each, in the order the report lists them, so that a reader knows which rows
    to rerun before comparing them. Versions shared by every run are said once."""
    if not records:
        return ["", "Runs came from: no run has finished yet."]
    if len({source(record) for record in records}) == 1:
        return ["", f"Runs came from: {source(records[0])}"] + _correction_lines(records)
    shared = all("commit" in record for record in records) and len({_versions(record) for record in records}) == 1
    runs_by_source: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    for record in records:
        runs_by_source[source(record, with_versions=not shared)][record["label"]].add(record["seed"])
    versions = f", every run with {_versions(records[0])}" if shared else ""
    lines = ["", f"Runs came from (MIXED: rerun the rows before comparing them{versions}):", ""]
    for origin, runs in runs_by_source.items():
        listed = "; ".join(f"{label} ({', '.join(map(str, sorted(seeds)))})" for label, seeds in runs.items())
        lines.append(f"- {origin}: {listed}")
    return lines + _correction_lines(records)


# What a record rescaled after it was measured carries: the GPT-2 losses recorded before commit 41678c9 (issue 49),
# when the Trainer divided by one token per row too many, were multiplied by L / (L - 1) once, by a migration script
# since removed (`git show 7372745:bench/correct_loss_count.py` holds it, with why the runs' training still stands).
CORRECTION_FIELD = "loss_count_correction"
MIGRATION = "`git show 7372745:bench/correct_loss_count.py`"


def _correction_lines(records: list[dict]) -> list[str]:
    """Which losses were rescaled after they were measured (`CORRECTION_FIELD`), and by what."""
    corrections = [record[CORRECTION_FIELD] for record in records if CORRECTION_FIELD in record]
    if not corrections:
        return []
    factors = ", ".join(sorted({f"{c['block_size']}/{c['block_size'] - 1}" for c in corrections}))
    fixed_in = ", ".join(sorted({c["fixed_in"] for c in corrections}))
    return [
        "",
        f"Losses of {len(corrections)} of these {len(records)} runs were measured before commit {fixed_in}, when the "
        f"Trainer divided a GPT-2 loss by one token per row too many; they were multiplied by {factors} afterwards "
        f"(once, by a migration script since removed: {MIGRATION}), which makes them exact, since every evaluated "
        f"block is full-length. Their "
        f"training ran as recorded, with gradients scaled by the inverse factor.",
    ]
