"""Stop training before the optimizer step of a NaN or infinite loss, or of a finite loss whose gradient is not
finite (every strategy, `none` included)."""

from __future__ import annotations

import torch
from accelerate import Accelerator

from .checkpoint_format import last_complete_checkpoint


class NonFiniteLossGuard:
    """Raises before the optimizer step of a non-finite loss, whose gradients would make the weights NaN: the
    weights stay those of the last step, and no checkpoint or final model is written from them.

    The flag builds up on the device over the micro-batches of one optimizer step and is read on the last one:
    one device synchronisation per optimizer step. Processes agree on it first, so that all stop at the same
    step and none updates or saves the weights with gradients another process made non-finite.
    """

    def __init__(self):
        self._not_finite: torch.Tensor | None = None

    def check(self, loss: torch.Tensor, accelerator: Accelerator, step: int, output_dir: str, learning_rate: float) -> None:
        """Call with every micro-batch's loss; raises `FloatingPointError` on the last micro-batch of a bad step."""
        not_finite = ~torch.isfinite(loss.detach())
        self._not_finite = not_finite if self._not_finite is None else self._not_finite | not_finite
        if not accelerator.sync_gradients:
            return
        stop, self._not_finite = self._not_finite, None
        if accelerator.num_processes > 1:
            stop = accelerator.reduce(stop.int(), "sum") > 0
        if stop:
            raise FloatingPointError(_message("training loss", step + 1, output_dir, learning_rate))

    @staticmethod
    def check_gradient_norm(grad_norm, accelerator: Accelerator, step: int, output_dir: str, learning_rate: float) -> None:
        """Call with the gradient norm the Trainer measures before `optimizer.step()`; raises `FloatingPointError`
        when it is NaN or infinite. A finite loss can have such a gradient (float16 weights overflow in the backward
        pass), and its update would make every weight NaN. The norm is of the gradients every process holds after
        their reduction, so all processes stop at the same step. Under mixed precision with a loss scaler (`--fp16`)
        an overflow is expected now and then: the scaler skips that step's update itself, and nothing is raised."""
        if accelerator.scaler is not None or grad_norm is None:
            return
        if not torch.isfinite(torch.as_tensor(grad_norm)).all():
            raise FloatingPointError(_message("gradient norm", step + 1, output_dir, learning_rate, str(float(grad_norm))))


def _message(what: str, step: int, output_dir: str, learning_rate: float, value: str = "NaN or inf") -> str:
    # The checkpoint a re-run resumes from: get_last_checkpoint would name an incomplete one.
    last = last_complete_checkpoint(output_dir)
    remedy = f"a lower learning_rate (this run: {learning_rate}) or a longer warm-up"
    way_on = f"To go on, resume from the last checkpoint, {last}, with {remedy}" if last else f"No checkpoint was saved yet: start again with {remedy}"
    return (
        f"the {what} is not finite ({value}) in step {step}: training stopped before that step's update, "
        f"so the weights are those after step {step - 1} and nothing was saved from them. {way_on}"
    )
