"""Which checkpoint a script resumes from (what makes a checkpoint complete, and a run finished, is
`hf_layertie.trainer.checkpoint_format`'s)."""

from __future__ import annotations

import logging
from pathlib import Path

from ..trainer.checkpoint_format import (
    TYING_STATE_NAME,
    check_checkpoint_readable,
    checkpoint_step,
    last_complete_checkpoint,
    missing_checkpoint_files,
)

logger = logging.getLogger(__name__)


def checkpoint_to_resume(output_dir: str | Path, resume_from_checkpoint: str | None) -> str | None:
    """An explicit `resume_from_checkpoint` (which must be complete), else the last complete checkpoint in
    `output_dir`: re-running a crashed command picks up where it was."""
    if resume_from_checkpoint is not None:
        if not Path(resume_from_checkpoint).is_dir():
            raise ValueError(f"--resume_from_checkpoint {resume_from_checkpoint}: no such folder")
        missing = missing_checkpoint_files(resume_from_checkpoint)
        if missing == [TYING_STATE_NAME]:
            raise ValueError(
                f"--resume_from_checkpoint {resume_from_checkpoint} has no {TYING_STATE_NAME}: its save was interrupted, "
                f"or a plain Trainer saved it (the scripts resume their own checkpoints; TyingTrainer.train("
                f"resume_from_checkpoint=...) resumes a plain Trainer's with tying_strategy='none')"
            )
        if missing:
            raise ValueError(f"--resume_from_checkpoint {resume_from_checkpoint} is incomplete: it has no {', '.join(missing)}")
        check_checkpoint_readable(resume_from_checkpoint)
        return str(resume_from_checkpoint)
    last = last_complete_checkpoint(output_dir)
    if last is not None:
        logger.warning(f"Resuming from {last}, the last complete checkpoint in {output_dir}")
    return None if last is None else str(last)


def training_resume_point(output_dir: str | Path, resume_from_checkpoint: str | None, finished: int | None) -> str | None:
    """Where a training command continues in `output_dir`, before any model or data is loaded: a finished run's
    complete output folder (`finished`: its step, from `finished_training_step`; the trainer finishes from it,
    training no step), else the checkpoint `checkpoint_to_resume` names. With neither, None, after refusing to train
    from scratch over a run that left no checkpoint (`refuse_training_over`)."""
    if finished is not None:
        if not missing_checkpoint_files(output_dir):
            return str(output_dir)
        resume_from_checkpoint = None  # finished from its last checkpoint, not trained again from an earlier one
    resume = checkpoint_to_resume(output_dir, resume_from_checkpoint)
    if resume is None:
        refuse_training_over(output_dir)
    return resume


def refuse_training_over(output_dir: str | Path) -> None:
    """Refuse to train from the start in `output_dir` where a run finished short of the steps now asked for and left
    no checkpoint to continue from: its model would be replaced by one trained again from scratch."""
    step = checkpoint_step(output_dir)
    if step:
        raise ValueError(
            f"{output_dir} holds a run trained to step {step}, and no checkpoint-N to continue it from (a run's "
            f"optimizer state is saved in its checkpoints only: --save_strategy): training here would start again "
            f"from scratch over its model. Pass a new --output_dir; to train its weights further with a fresh "
            f"optimizer, also --model_name_or_path {output_dir}"
        )
