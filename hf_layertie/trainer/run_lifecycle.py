"""A training run's life over several sittings: where a command continues, what a finished run does, the totals.

A run is trained in sittings: a crash, a kill or a larger `max_steps` ends one, and the same command continues it.
This module is the one owner of that life, for `TyingTrainer` and for the three scripts (`run_clm.py`, `run_mlm.py`,
`run_lambada.py`):

- **where a command continues** (`training_start`): a finished run is not trained again (its saved results are
  returned, or what it lacks is produced from its final model, training no step: `TyingTrainer.train` finishes
  from it); else the last complete checkpoint (`checkpoint_format.last_complete_checkpoint`) or the one named; a
  run that finished short of the steps now asked and left no checkpoint is refused rather than trained over;
- **when a run is finished** (`finished_training_step`): its output folder's trainer state reached the steps asked;
- **the training totals** (`TrainingTotals`, `RunTotals`): `Trainer.train` reports the loss, runtime and speeds of
  the steps its own call trained, so a resumed run would report only the steps after its checkpoint and a run
  finished from one at `max_steps` none. Every checkpoint's tying state carries the totals so far, and the trainer
  adds the sitting under way, so that a resumed run reports the whole run's;
- **the end of a training command** (`save_training_outputs`): the final model, metrics and trainer state, the
  state written last, as it is what tells a re-run that the run finished.

What a checkpoint holds and when it is complete is `checkpoint_format`'s.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from transformers import Trainer
from transformers.trainer import TRAINER_STATE_NAME

from .checkpoint_format import (
    TYING_STATE_NAME,
    check_checkpoint_readable,
    check_resumes_starting_model,
    check_tying_state_belongs,
    checkpoint_step,
    last_complete_checkpoint,
    missing_checkpoint_files,
    read_json,
    read_tying_state,
)
from .guards import check_resumes_saved_settings
from .training_args import TyingTrainingArguments

logger = logging.getLogger(__name__)

# What a training command leaves in its output folder besides a complete checkpoint's files (the final model's): its
# results and the model card (`save_training_outputs`).
FINAL_OUTPUTS = ("all_results.json", "README.md")


# ----- when a run is finished, and where a command continues it -----


def finished_training_step(output_dir: str | Path, max_steps: int, num_train_epochs: float | None = None) -> int | None:
    """The final step of a training run in `output_dir` (its output folder, or a checkpoint of it) that already
    reached `max_steps`, else None. With `max_steps <= 0` (training by epochs) the run's own last step is the target,
    unless `num_train_epochs` asks for more epochs than the run trained: it then continues from its last complete
    checkpoint (with none, the scripts refuse to train over it: `refuse_training_over`).

    `Trainer.save_state()` writes `trainer_state.json` into `output_dir` itself once training is over; training a
    finished run again would only add steps past its end (transformers resumes one step further).
    """
    path = os.path.join(output_dir, TRAINER_STATE_NAME)
    if not os.path.isfile(path):
        return None
    state = read_json(path)
    step = state.get("global_step", 0)
    # The epochs trained (`epoch`, a fraction: the saved `num_train_epochs` is rounded up); a state without it is a
    # run's that ended as the Trainer ends one, judged by its own last step below.
    if max_steps <= 0 and num_train_epochs is not None and num_train_epochs > state.get("epoch", num_train_epochs) + 1e-6:
        return None
    target = max_steps if max_steps > 0 else state.get("max_steps", 0)
    return step if target > 0 and step >= target else None


@dataclass(frozen=True)
class TrainingStart:
    """Where a training command continues in its output folder.

    Attributes:
        resume: what `TyingTrainer.train(resume_from_checkpoint=...)` is given: a checkpoint, the output folder of a
            finished run (finished from, training no step), or None (from the start).
        finished_step: the step a finished run in the output folder ended at; None if it is not finished.
        saved_metrics: a finished run that holds every output this command asks for: its saved results, which the
            command returns without loading any model (None otherwise).
    """

    resume: str | None = None
    finished_step: int | None = None
    saved_metrics: dict[str, float] | None = None


def training_start(
    training_args: TyingTrainingArguments, asked_beyond_saved: Callable[[dict[str, float]], list[str]] = lambda saved: []
) -> TrainingStart:
    """Where a training command continues in `training_args.output_dir`, decided before any model or data is loaded.

    A finished run (`finished_training_step`) is not trained again: with every file of `FINAL_OUTPUTS` and nothing
    `asked_beyond_saved` (a script's: what this command asks that the saved results lack, e.g. an evaluation of other
    data), its saved results are returned, after checking that this command's tying settings are the run's; else what
    it lacks is produced from its final model (or its last checkpoint when the folder lost its model). An unfinished
    run continues from its last complete checkpoint or `--resume_from_checkpoint`; a run that left no checkpoint to
    continue is refused (`refuse_training_over`).
    """
    output_dir = training_args.output_dir
    finished = finished_training_step(output_dir, training_args.max_steps, training_args.num_train_epochs)
    if finished is None:
        return TrainingStart(resume=training_resume_point(output_dir, training_args.resume_from_checkpoint, None))
    if training_args.resume_from_checkpoint is not None:
        logger.warning(
            f"Training in {output_dir} already finished at step {finished}: --resume_from_checkpoint "
            f"{training_args.resume_from_checkpoint} is not used (no step is trained again over its final model). To "
            "train from that checkpoint, pass a new --output_dir; to continue the run, a larger --max_steps"
        )
    missing = missing_checkpoint_files(output_dir) + [name for name in FINAL_OUTPUTS if not Path(output_dir, name).is_file()]
    results = Path(output_dir, "all_results.json")
    saved = read_json(results) if results.is_file() else {}
    asked = [] if missing else asked_beyond_saved(saved)
    if not missing and not asked:
        # Its results are those of the settings it ran under: this command's must be the same.
        check_resumes_saved_settings(training_args, output_dir, read_tying_state(output_dir))
        logger.warning(
            f"Training in {output_dir} already finished at step {finished}: nothing is trained or changed. "
            f"Pass a larger --max_steps (or --num_train_epochs) to continue it, or a new --output_dir to train again."
        )
        return TrainingStart(finished_step=finished, saved_metrics=saved)
    logger.warning(
        f"Training in {output_dir} finished at step {finished} without {', '.join([*missing, *asked])}: producing them, "
        "training no step"
    )
    return TrainingStart(resume=training_resume_point(output_dir, None, finished), finished_step=finished)


def training_resume_point(output_dir: str | Path, resume_from_checkpoint: str | None, finished: int | None) -> str | None:
    """Where a training command continues in `output_dir`: a finished run's complete output folder (`finished`: its
    step, from `finished_training_step`; the trainer finishes from it, training no step), else the checkpoint
    `checkpoint_to_resume` names. With neither, None, after refusing to train from scratch over a run that left no
    checkpoint (`refuse_training_over`)."""
    if finished is not None:
        if not missing_checkpoint_files(output_dir):
            return str(output_dir)
        resume_from_checkpoint = None  # finished from its last checkpoint, not trained again from an earlier one
    resume = checkpoint_to_resume(output_dir, resume_from_checkpoint)
    if resume is None:
        refuse_training_over(output_dir)
    return resume


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


def resume_argument(resume_from_checkpoint: str | os.PathLike | bool | None, args: TyingTrainingArguments) -> tuple[str | None, bool]:
    """`TyingTrainer.train`'s `resume_from_checkpoint` as a folder (True: the last complete checkpoint in
    `output_dir`, where transformers would take the highest-numbered folder, complete or not), and whether that
    folder already reached the run's end (the trainer then finishes from it, training no step)."""
    if resume_from_checkpoint is True:
        resume_from_checkpoint = last_complete_checkpoint(args.output_dir)
        if resume_from_checkpoint is None:
            raise ValueError(f"resume_from_checkpoint=True: no complete checkpoint in {args.output_dir}")
    if isinstance(resume_from_checkpoint, os.PathLike):
        resume_from_checkpoint = os.fspath(resume_from_checkpoint)
    if not isinstance(resume_from_checkpoint, str):
        return resume_from_checkpoint or None, False
    return resume_from_checkpoint, finished_training_step(resume_from_checkpoint, args.max_steps, args.num_train_epochs) is not None


def read_resumable_tying_state(checkpoint: str, args: TyingTrainingArguments, model) -> dict | None:
    """The tying state of `checkpoint` (None: a plain Trainer's checkpoint), once checked that this run may continue
    it: its files readable, the state its own, saved under this run's tying settings and from the model this run
    starts from (`untie_init="own"` unties to that model's weights)."""
    state = read_tying_state(checkpoint)
    check_checkpoint_readable(checkpoint)
    check_tying_state_belongs(checkpoint, state)
    check_resumes_saved_settings(args, checkpoint, state)
    check_resumes_starting_model(checkpoint, state, args.untie_init, model)
    return state


def save_training_outputs(trainer: Trainer, metrics: dict[str, float]) -> None:
    """The end of a training command: the final model (with its tying state, plot and card), the training metrics
    (logged, `train_results.json`, `all_results.json`), and the trainer state last: it is what tells a re-run that
    the run finished (`finished_training_step`)."""
    trainer.save_model()
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()


# ----- the run's training totals -----


@dataclass(frozen=True)
class TrainingTotals:
    """The summed training loss (as `Trainer.training_step` returns it, averaged over processes) and the wall time
    in `Trainer.train` of a run's optimizer steps after `start_step`, over every sitting up to a checkpoint.

    `start_step` is 0, except for a run resumed from a checkpoint that holds no totals (a plain Trainer's): its
    metrics then count the steps after that checkpoint only, and say so (`train_metrics_from_step`).
    """

    start_step: int = 0
    loss_sum: float = 0.0
    runtime: float = 0.0

    @classmethod
    def saved_in(cls, tying_state: dict | None, step: int) -> TrainingTotals:
        """The totals of a checkpoint saved at `step` with `tying_state` (None: it has no tying state, a plain
        Trainer's checkpoint: counted from its step)."""
        return cls(**tying_state["training"]) if tying_state is not None else cls(start_step=step)

    def plus(self, loss_sum: float, runtime: float) -> TrainingTotals:
        """These totals with one more sitting's."""
        return dataclasses.replace(self, loss_sum=self.loss_sum + loss_sum, runtime=self.runtime + runtime)

    def metrics(self, step: int, samples_per_step: int, total_flos: float) -> dict[str, float]:
        """`Trainer.train`'s training metrics (`train_loss`, `train_runtime`, `train_*_per_second`, `total_flos`)
        of the steps counted up to `step`, the runtime being the sum of the sittings'."""
        steps = step - self.start_step
        metrics = {
            "train_loss": self.loss_sum / steps if steps > 0 else math.nan,
            "train_runtime": round(self.runtime, 4),
            "total_flos": total_flos,
        }
        if self.runtime > 0:
            metrics["train_samples_per_second"] = round(steps * samples_per_step / self.runtime, 3)
            metrics["train_steps_per_second"] = round(steps / self.runtime, 3)
        if self.start_step > 0:
            metrics["train_metrics_from_step"] = self.start_step
        return metrics


class RunTotals:
    """The totals a trainer keeps: those of the checkpoint it resumed from (`saved`), plus the sitting under way.

    Args:
        mean: the mean of a number over the processes (collective), which the sitting's summed loss goes through
            once, when the totals are read.
    """

    def __init__(self, mean: Callable[[float], float]):
        self._mean = mean
        self.restart()

    def restart(self, saved: TrainingTotals | None = None) -> None:
        """Forget the sitting (an earlier `train` call left unfinished by an error is not one) and start from
        `saved`: a checkpoint's totals, or none."""
        self.saved = saved if saved is not None else TrainingTotals()
        self._sitting_loss = 0.0
        self._sitting_start: float | None = None

    def start_sitting(self) -> None:
        self._sitting_start = time.time()

    @property
    def in_sitting(self) -> bool:
        return self._sitting_start is not None

    def add_loss(self, loss) -> None:
        """One micro-batch's loss, summed on its device as the Trainer sums it: no synchronisation per step."""
        self._sitting_loss += loss

    def now(self, sitting_runtime: float | None = None) -> TrainingTotals:
        """The run's totals up to now (collective during a sitting). Its runtime is `sitting_runtime` when the sitting
        is over (`Trainer.train`'s own measure), else the time since it began."""
        if self._sitting_start is None:
            return self.saved
        runtime = time.time() - self._sitting_start if sitting_runtime is None else sitting_runtime
        return self.saved.plus(self._mean(float(self._sitting_loss)), runtime)

    def end_sitting(self, runtime: float) -> TrainingTotals:
        """Close the sitting (its loss summed over the processes once): its totals become the saved ones."""
        self.saved, self._sitting_start = self.now(runtime), None
        return self.saved
