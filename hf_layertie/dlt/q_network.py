"""The Q-network of Dynamic Layer Tying: one Q value per (block, action) given the current tying map.

Block `i` (1 <= i < L) has `i + 1` actions: action `j < i` ties block `i` to block `j`, action `i`
keeps it independent, so the action index is the source block. Block 0 never decides (it is
always independent) and has no outputs. The outputs of all deciding blocks are laid out one slice
after another, block 1 first, so one forward pass scores every decision the sweep can ask for.
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.tying_map import TyingMap


def _slice_start(block: int) -> int:
    """Offset of `block`'s slice: blocks 1..block-1 come first, with 2..block actions each."""
    return block * (block + 1) // 2 - 1


class TyingQNetwork(nn.Module):
    """An MLP from the encoded tying map to the Q values of every block's actions.

    Args:
        num_blocks: number of transformer blocks `L` (at least 2, else there is nothing to decide).
        hidden_size: width of the two hidden layers.
    """

    def __init__(self, num_blocks: int, hidden_size: int = 128):
        super().__init__()
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be at least 2 (block 0 never decides), got {num_blocks}")
        self.num_blocks = num_blocks
        self.num_actions = _slice_start(num_blocks)
        self.layers = nn.Sequential(
            nn.Linear(num_blocks * num_blocks, hidden_size),
            nn.ReLU(),
            nn.Linear(hidden_size, hidden_size),
            nn.ReLU(),
            nn.Linear(hidden_size, self.num_actions),
        )

    @staticmethod
    def encode(tying_map: TyingMap) -> torch.Tensor:
        """Flattened `L x L` one-hot of each block's source: row `i` has a 1 at column `tying_map[i]`.

        Why one-hot: a source index is a category, not a quantity. Feeding the raw map would tell the
        network that "tied to block 4" lies between "tied to 3" and "tied to 5" and that block 0's
        weights are "small", which is meaningless; with one-hot rows the first layer learns a separate
        contribution for every (block, source) pair. `L * L` inputs stay tiny (144 for 12 blocks).
        """
        sources = torch.tensor(tying_map.entries)
        return nn.functional.one_hot(sources, num_classes=len(sources)).flatten().float()

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        """`states`: `[batch, L * L]` encoded maps. Returns `[batch, num_actions]` Q values."""
        expected = self.num_blocks * self.num_blocks
        if states.shape[-1] != expected:
            raise ValueError(
                f"states must have {expected} features (the {self.num_blocks} x {self.num_blocks} one-hot "
                f"of TyingQNetwork.encode), got shape {tuple(states.shape)}"
            )
        return self.layers(states)

    def block_q_values(self, q_row: torch.Tensor, block: int) -> torch.Tensor:
        """The `block + 1` Q values of `block`'s actions, cut from one output row of `forward`."""
        if not 1 <= block < self.num_blocks:
            raise ValueError(f"block must be in 1..{self.num_blocks - 1} (block 0 never decides), got {block}")
        start = _slice_start(block)
        return q_row[..., start : start + block + 1]
