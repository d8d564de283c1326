"""Gradient norms by group during a run: what a shared block receives against what an untied one does (issue 53).

A block shared by several positions accumulates the sum of its positions' gradients in one Parameter, and the
Trainer's clipping (`max_grad_norm`) and AdamW's weight decay act on that sum and on that Parameter. Whether that is
why tied models train less reliably under one recipe than another is a question for measurements, so a run with
`--gradient_norm_interval N` records, every N optimizer steps:

- `blocks`: for each distinct block (keyed by the position that owns it), the norm of its gradient and how many
  positions use it;
- `other`: the norm of every other Parameter's gradient (embeddings, final norm, head);
- `clipped_total`: the norm of the whole gradient as the optimizer receives it, after clipping.

Norms are read in `on_pre_optimizer_step`, after the Trainer clipped: clipping multiplies every gradient by one
factor, so the ratios between groups are those before clipping, and the run's log (its `grad_norm`, logged every
N steps with this setting) holds the norm before clipping.
"""

from __future__ import annotations

import math

import torch
from transformers import TrainerCallback


def _squared_norm(parameters: list[torch.nn.Parameter]) -> float:
    return sum(float(parameter.grad.detach().float().pow(2).sum()) for parameter in parameters if parameter.grad is not None)


def group_gradient_norms(model) -> dict:
    """The norms above for a tied model's current gradients, each shared Parameter counted once."""
    blocks = model.tied_blocks
    seen: set[int] = set()
    norms, squared_sum = {}, 0.0
    for owner, positions in model.tying_map.groups().items():
        parameters = list(blocks[owner].parameters())
        seen.update(id(parameter) for parameter in parameters)
        squared = _squared_norm(parameters)
        norms[str(owner)] = {"norm": math.sqrt(squared), "positions": len(positions)}
        squared_sum += squared
    other = _squared_norm([parameter for parameter in model.parameters() if id(parameter) not in seen])
    # the groups and the rest partition the model's Parameters, so their squares add up to the whole gradient's
    return {"blocks": norms, "other": math.sqrt(other), "clipped_total": math.sqrt(squared_sum + other)}


class GradientNorms(TrainerCallback):
    """`group_gradient_norms` every `interval` optimizer steps, in `records` (one dict per step, with its `step`)."""

    def __init__(self, model, interval: int):
        self.model = model
        self.interval = interval
        self.records: list[dict] = []

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        step = state.global_step + 1  # the step this optimizer update completes
        if step % self.interval == 0:
            self.records.append({"step": step, **group_gradient_norms(self.model)})
