"""Stop training before the optimizer step of a NaN or infinite loss, or of a finite loss whose gradient is not
finite (every strategy, `none` included)."""

from __future__ import annotations

import math

import torch
from accelerate import Accelerator

from .checkpoint_format import last_complete_checkpoint


class NonFiniteLossGuard:
    """Raises before the optimizer step of a non-finite loss, or of a finite loss whose gradient norm is not finite
    (float16 weights overflow in the backward pass): either would make the weights NaN. The weights stay those of the
    last step, and no checkpoint or final model is written from them.

    The loss flag builds up on the device over the micro-batches of one optimizer step (`observe`); `check` reads it
    together with the gradient norm the Trainer measures before `optimizer.step()`: one device synchronisation per
    optimizer step. Processes agree on the loss flag first, so that all stop at the same step and none updates or
    saves the weights with gradients another process made non-finite; the norm is of the reduced gradients, the
    same on every process.
    """

    def __init__(self):
        self._not_finite: torch.Tensor | None = None

    def observe(self, loss: torch.Tensor) -> None:
        """Call with every micro-batch's loss (nothing is read from the device here)."""
        not_finite = ~torch.isfinite(loss.detach())
        self._not_finite = not_finite if self._not_finite is None else self._not_finite | not_finite

    def check(self, grad_norm, accelerator: Accelerator, step: int, output_dir: str, learning_rate: float) -> None:
        """Call once per optimizer step, before its update, with the step's gradient norm; raises `FloatingPointError`
        when a micro-batch's loss (on any process) or the norm is NaN or infinite. Under mixed precision with a loss
        scaler (`--fp16`) an overflowing gradient is expected now and then: the scaler skips that step's update
        itself, and the norm is not checked."""
        loss_flag, self._not_finite = self._not_finite, None
        if loss_flag is None:  # no loss observed (a training step of another trainer)
            loss_flag = torch.zeros((), dtype=torch.bool, device=accelerator.device)
        if accelerator.num_processes > 1:
            loss_flag = accelerator.reduce(loss_flag.int(), "sum") > 0
        checked_norm = grad_norm if accelerator.scaler is None and grad_norm is not None else 0.0
        norm = torch.as_tensor(checked_norm, dtype=torch.float32, device=loss_flag.device)
        loss_not_finite, norm = torch.stack([loss_flag.float(), norm]).tolist()  # the one synchronisation
        if loss_not_finite:
            raise FloatingPointError(_message("training loss", step + 1, output_dir, learning_rate))
        if not math.isfinite(norm):
            raise FloatingPointError(_message("gradient norm", step + 1, output_dir, learning_rate, str(norm)))


def _message(what: str, step: int, output_dir: str, learning_rate: float, value: str = "NaN or inf") -> str:
    # The checkpoint a re-run resumes from: get_last_checkpoint would name an incomplete one.
    last = last_complete_checkpoint(output_dir)
    remedy = f"a lower learning_rate (this run: {learning_rate}) or a longer warm-up"
    way_on = f"To go on, resume from the last checkpoint, {last}, with {remedy}" if last else f"No checkpoint was saved yet: start again with {remedy}"
    return (
        f"the {what} is not finite ({value}) in step {step}: training stopped before that step's update, "
        f"so the weights are those after step {step - 1} and nothing was saved from them. {way_on}"
    )
