#!/usr/bin/env python
"""Correct the stored losses of tied GPT-2 language-modeling runs made before the token count was fixed.

Until commit 41678c9 (issue 49), the Trainer divided a tied GPT-2's summed loss by the count of all labels, one
token per row more than the model scores (position 0 has no prediction), so every loss it reported was low by
(L - 1) / L for rows of L tokens. Every evaluated block of the study and of the compression benchmark is full-length
(`tokenize_and_group` drops the remainder), so the stored validation and test losses are off by exactly that factor:
this script multiplies them by L / (L - 1) and marks each record it changed with `loss_count_correction`, which the
reports name. What it does not change, and cannot: the runs were trained with gradients scaled by the same factor.
AdamW's update does not depend on the gradient's scale (but for its epsilon, 1e-8), nor does clipping once it
clips; a run repeated at the fixed commit differs only where clipping at 1.0 sits between the two scales.

The DLT reward saw the same factor. The default agent's value is a least-squares fit, linear in its targets, so it
chooses the same actions from rewards scaled by a constant (with `reward_block_cost` 0, the study's); the paper
agent's clipped -perplexity is -10 either way while the loss is above ln 10, as in every run here. Only the paper
agent learning from -loss (a control) trains a network by gradient steps, which a scale can change: on the synthetic
problem (`hf_layertie.dlt.synthetic`, 12 blocks, 1,000 decisions) its actions first differed after 153 to 538
decisions across 5 seeds, where the other two agents' were identical throughout.

Left alone: records from commits that already count correctly, Llama-family runs (their class names name their
loss, so they were always exact), and the k-hop tasks, whose rows start with ignored labels (nothing was counted
twice). The count bigram, computed by hand, was always exact.

    python bench/correct_loss_count.py bench/results/default              # block size from settings.json
    python bench/correct_loss_count.py bench/results/some-probe --block_size 64
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from bench.settings import folder_settings  # noqa: E402

FIX_COMMIT = "41678c9"
LOSS_FIELDS = ("validation_loss", "test_loss", "final_test_loss", "test_loss_at_best_validation", "teacher_test_loss")
CURVE_FIELDS = ("validation_loss", "test_loss")
CORRECTION_FIELD = "loss_count_correction"


def correct_folder(
    folder: Path, block_size: int | None = None, fixed_in: str = FIX_COMMIT, repository: Path = REPO_ROOT
) -> tuple[int, int]:
    """Correct every record under `folder` made before commit `fixed_in` (of `repository`'s history); returns
    (records changed, records left alone). A second call changes nothing."""
    settings = folder_settings(folder) if (folder / "settings.json").is_file() else {}  # a probe's folder may have none
    if "task" in settings:
        raise ValueError(f"{folder} holds runs of {settings['task']}, whose rows start with ignored labels: nothing to correct")
    block_size = block_size or settings.get("block_size")
    if not block_size:
        raise ValueError(f"{folder} has no settings.json with a block_size: pass --block_size")
    changed = unchanged = 0
    for path in sorted(folder.rglob("result.json")):
        record = json.loads(path.read_text())
        if not _needs_correction(record, fixed_in, repository):
            unchanged += 1
            continue
        _check_full_blocks(record, block_size, path)
        path.write_text(json.dumps(_corrected(record, block_size, fixed_in), indent=2) + "\n")
        changed += 1
    return changed, unchanged


def _needs_correction(record: dict, fixed_in: str, repository: Path) -> bool:
    """A GPT-2 record with losses, from a commit before the fix, not corrected yet."""
    if CORRECTION_FIELD in record or record.get("model_type", "tied_gpt2") != "tied_gpt2":
        return False
    if not any(record.get(field) is not None for field in LOSS_FIELDS):  # a memory run: no loss measured
        return False
    commit = record["commit"].removesuffix("+dirty")  # a dirty tree counts as its commit: the fix is committed
    fixed = subprocess.run(["git", "-C", str(repository), "merge-base", "--is-ancestor", fixed_in, commit], capture_output=True)
    if fixed.returncode not in (0, 1):
        raise ValueError(f"commit {record['commit']} of a record is not in this repository's history: {fixed.stderr.decode()}")
    return fixed.returncode == 1


def _check_full_blocks(record: dict, block_size: int, path: Path) -> None:
    tokens = record.get("test_tokens")
    if tokens is not None and tokens % block_size:
        raise ValueError(f"{path}: {tokens} test tokens are not whole blocks of {block_size}: the factor would not be exact")


def _corrected(record: dict, block_size: int, fixed_in: str) -> dict:
    factor = block_size / (block_size - 1)
    record = dict(record)
    for field in LOSS_FIELDS:
        if record.get(field) is not None:
            record[field] *= factor
    if "validation_curve" in record:
        record["validation_curve"] = [
            {key: value * factor if key in CURVE_FIELDS and value is not None else value for key, value in point.items()}
            for point in record["validation_curve"]
        ]
    record[CORRECTION_FIELD] = {"factor": factor, "block_size": block_size, "fixed_in": fixed_in}
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="results folders (bench/results/<name>)")
    parser.add_argument("--block_size", type=int, default=None, help="tokens per row, where a folder has no settings.json")
    args = parser.parse_args()
    for folder in args.folders:
        changed, unchanged = correct_folder(folder, args.block_size)
        print(f"{folder}: {changed} records corrected, {unchanged} left as they were")


if __name__ == "__main__":
    main()
