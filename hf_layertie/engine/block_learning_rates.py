"""A learning rate per block set by how many positions use it (`loop_lr_exponent`): a block whose weights N positions
share trains at `learning_rate * N ** -loop_lr_exponent`.

Why: a shared block's gradient is the sum of its N positions' gradients, so at one learning rate its updates grow
with N. Scaling each block's rate down by its use count makes the best learning rate depend on the unique blocks
alone (the point of the 1/N residual scaling of Tsinghua/ByteDance, arXiv 2606.18524, whose per-block rate this is;
`config.loop_residual_scale` is its other half).

How it survives a run: the optimizer gets, for each param group the Trainer builds (with and without weight decay),
one group per use count 1..L, each with its scaled `lr` (`split_by_block_uses`, before the learning-rate scheduler
reads the groups' rates). The group count never changes afterwards, so the scheduler keeps scaling every group, a
saved `optimizer.pt` reloads group for group, and a re-tie only moves Parameters between sibling groups
(`group_by_block_uses`, called by `optimizer_sync` whenever it regroups). Parameters outside the blocks (embeddings,
final norm) count as used once. The count is the map's (every position of the block), not the depth one step computes
(`loop_onset`): it changes only with a re-tie, when the optimizer is regrouped anyway.
"""

from __future__ import annotations

import math
from collections import Counter

import torch
from torch import nn

# Keys each param group carries under `loop_lr_exponent` (saved with the optimizer's state): the use count of its
# Parameters and the index of the Trainer's group it was split from.
BLOCK_USES = "block_uses"
SPLIT_FROM = "split_from_group"


def check_loop_lr_exponent(value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"loop_lr_exponent must be a positive number (1: learning_rate / N, 0.5: / sqrt(N)), got {value!r}")


def block_uses(model: nn.Module) -> Counter:
    """How many block positions of `model` (a tied model) use each Parameter; those outside the blocks are absent."""
    uses = Counter()
    for position in model.tied_blocks:
        uses.update(position.parameters())
    return uses


def split_by_block_uses(optimizer: torch.optim.Optimizer, model: nn.Module, exponent: float) -> None:
    """Split each of `optimizer`'s groups into one group per use count 1..L (`model`'s positions), the group of count
    N at `lr * N ** -exponent`. Only before any step: a group's state would otherwise stay behind."""
    optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps the torch one
    if optimizer.state:
        raise ValueError("loop_lr_exponent splits the optimizer's param groups before its first step; this one has state already")
    uses = block_uses(model)
    groups = list(optimizer.param_groups)
    optimizer.param_groups = []
    for index, group in enumerate(groups):
        for count in range(1, len(model.tied_blocks) + 1):
            params = [parameter for parameter in group["params"] if uses.get(parameter, 1) == count]
            scaled = {"lr": group["lr"] * count**-exponent, BLOCK_USES: count, SPLIT_FROM: index}
            optimizer.add_param_group({**group, **scaled, "params": params})


def group_by_block_uses(optimizer: torch.optim.Optimizer, model: nn.Module, group_of: dict[nn.Parameter, int]) -> None:
    """Move each Parameter of `group_of` (its group index, that of the weights it continues after a re-tie) to the
    sibling group of its current use count, in place; nothing happens for an optimizer `split_by_block_uses` did not
    split."""
    groups = optimizer.param_groups
    if not groups or BLOCK_USES not in groups[0]:
        return
    sibling = {(group[SPLIT_FROM], group[BLOCK_USES]): index for index, group in enumerate(groups)}
    uses = block_uses(model)
    for parameter, index in group_of.items():
        group_of[parameter] = sibling[groups[index][SPLIT_FROM], uses.get(parameter, 1)]
