"""Which checkpoint a run resumes from, and whether a run already finished.

A kill, a crash or a full disk in the middle of a save leaves a `checkpoint-N` folder without some of its files.
transformers' `get_last_checkpoint` picks the highest-numbered folder whatever it holds, and every re-run then
fails on the missing files. Here a checkpoint counts only when it is complete: the files the Trainer writes
last (`trainer_state.json`) and, for a tying run, `tying_state.pt` (written after them, atomically) are present,
with the model's config and weights.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

logger = logging.getLogger(__name__)

TRAINER_STATE = "trainer_state.json"
TYING_STATE = "tying_state.pt"
WEIGHTS_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
_CHECKPOINT_NAME = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


def missing_checkpoint_files(checkpoint: str | Path) -> list[str]:
    """The files a complete checkpoint has and `checkpoint` lacks (empty: it is complete).

    `TyingTrainer` writes `tying_state.pt` last, for every strategy (`none` included), so a checkpoint without it
    was interrupted while saving; one saved under other settings is complete, and resuming from it is refused by
    the trainer, naming the difference, rather than skipped.
    """
    checkpoint = Path(checkpoint)
    missing = [name for name in ("config.json", TRAINER_STATE) if not (checkpoint / name).is_file()]
    if not any((checkpoint / name).is_file() for name in WEIGHTS_FILES):
        missing.append(" or ".join(WEIGHTS_FILES))
    if not (checkpoint / TYING_STATE).is_file():
        missing.append(TYING_STATE)
    return missing


def last_complete_checkpoint(output_dir: str | Path) -> Path | None:
    """The highest-numbered complete `checkpoint-N` in `output_dir`; incomplete ones are skipped with a warning."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return None
    numbered = [(int(match.group(1)), path) for path in output_dir.iterdir() if (match := _CHECKPOINT_NAME.match(path.name))]
    for _, checkpoint in sorted(numbered, reverse=True):
        missing = missing_checkpoint_files(checkpoint)
        if not missing:
            return checkpoint
        logger.warning(f"Skipping {checkpoint}: an interrupted save left it without {', '.join(missing)}")
    return None


def checkpoint_to_resume(output_dir: str | Path, resume_from_checkpoint: str | None) -> str | None:
    """An explicit `resume_from_checkpoint` (which must be complete), else the last complete checkpoint in
    `output_dir`: re-running a crashed command picks up where it was."""
    if resume_from_checkpoint is not None:
        missing = missing_checkpoint_files(resume_from_checkpoint)
        if missing:
            raise ValueError(f"--resume_from_checkpoint {resume_from_checkpoint} is incomplete: it has no {', '.join(missing)}")
        return str(resume_from_checkpoint)
    last = last_complete_checkpoint(output_dir)
    if last is not None:
        logger.warning(f"Resuming from {last}, the last complete checkpoint in {output_dir}")
    return None if last is None else str(last)


def finished_training_step(output_dir: str | Path, max_steps: int) -> int | None:
    """The final step of a training run in `output_dir` that already reached `max_steps` (the run's own, when
    `max_steps <= 0`, as with epochs), else None.

    `Trainer.save_state()` writes `trainer_state.json` into `output_dir` itself once training is over; training a
    finished run again would only add steps past its end (transformers resumes one step further).
    """
    path = Path(output_dir) / TRAINER_STATE
    if not path.is_file():
        return None
    with open(path) as file:
        state = json.load(file)
    step = state.get("global_step", 0)
    target = max_steps if max_steps > 0 else state.get("max_steps", 0)
    return step if target > 0 and step >= target else None
