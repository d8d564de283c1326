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

import torch
from transformers import TrainerCallback


def _norm(parameters: list[torch.nn.Parameter]) -> float:
    squares = [parameter.grad.detach().float().pow(2).sum() for parameter in parameters if parameter.grad is not None]
    return float(torch.stack(squares).sum().sqrt()) if squares else 0.0


def group_gradient_norms(model) -> dict:
    """The norms above for a tied model's current gradients, each shared Parameter counted once."""
    blocks = model.tied_blocks
    seen: set[int] = set()
    norms = {}
    for owner, positions in model.tying_map.groups().items():
        parameters = list(blocks[owner].parameters())
        seen.update(id(parameter) for parameter in parameters)
        norms[str(owner)] = {"norm": _norm(parameters), "positions": len(positions)}
    others = [parameter for parameter in model.parameters() if id(parameter) not in seen]
    every = list(model.parameters())
    return {"blocks": norms, "other": _norm(others), "clipped_total": _norm(every)}


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
