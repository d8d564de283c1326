"""What the two agent variants learn from rewards: a linear afterstate value, or the paper's Q-network.

An action of block `i` has a known, deterministic result, the map `tying_map.with_decision(i, source)` (its
"afterstate"). `AfterstateValue` scores that map; `PaperQNetwork` scores the (map, action) pair as the
authors' code does, with one output slice per block.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..models.tying_map import TyingMap

# The trend of the reward over decisions is a constant plus decaying exponentials with these time constants (in
# decisions): bounded features that can follow a loss curve's steep start and its slow tail alike. (A local
# linear trend missed the curvature of a steep start and found the best synthetic map in 0 of 10 runs; this
# basis in 19 of 20, see hf_layertie/dlt/README.md.)
TREND_TIME_SCALES = (3.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0)
# The trend's prior precision relative to the map weights': just enough to keep the system positive definite.
TREND_PRIOR_SHARE = 1e-6


class AfterstateValue:
    """Expected reward of reaching a map, linear in the map: one weight per (block, source) pair.

    The reward of a decision is the loss over the steps after it, which falls through training whatever the
    agent does. Fitting a trend of time (`TREND_TIME_SCALES`) together with the map weights, in one
    least-squares problem, is what separates the two: the map weights only explain what the trend does not. (A trend
    estimated first from the losses alone absorbs the agent's own improvements, and then rewards nothing;
    measured on the synthetic problem, it found the best map in 0 of 20 runs against 9 of 20.)

    The fit is ridge regression with exponential forgetting, solved exactly after every decision:
    `A <- forgetting * A + (1 - forgetting) * R + x x^T`, `b <- forgetting * b + target * x`, `w = A^-1 b`,
    where the prior `R` is `ridge` on the map weights and (almost) nothing on the trend, so that the level of
    the reward goes to the trend and the map weights only carry differences between maps (every map switches
    on exactly one weight per block, so a penalised trend would push the level into the weights of the maps
    tried most, and untried maps would look best). Forgetting follows the model being trained, which keeps
    changing; refilling the forgotten part with the prior keeps `A` well conditioned however long the run.
    Weights of (block, source) pairs never tried stay 0, the value of an average pair.

    Args:
        num_blocks: blocks of the model.
        forgetting: weight factor per update (`AgentConfig.q_forgetting`).
        ridge: prior precision of every weight (`AgentConfig.q_ridge`).
    """

    def __init__(self, num_blocks: int, forgetting: float, ridge: float):
        self.num_blocks = num_blocks
        self.forgetting = forgetting
        self.ridge = ridge
        self.num_map_features = num_blocks * (num_blocks + 1) // 2
        size = self.num_map_features + 1 + len(TREND_TIME_SCALES)  # map one-hots, then the trend's basis
        self.prior = torch.full((size,), ridge, dtype=torch.float64)
        self.prior[self.num_map_features :] = ridge * TREND_PRIOR_SHARE
        self.precision = torch.diag(self.prior)
        self.moment = torch.zeros(size, dtype=torch.float64)
        self.weights = torch.zeros(size, dtype=torch.float64)

    def map_features(self, tying_map: TyingMap) -> torch.Tensor:
        """Indices of the active one-hots: block `i` with source `j <= i` is feature `i (i + 1) / 2 + j`."""
        return torch.tensor([block * (block + 1) // 2 + source for block, source in enumerate(tying_map)])

    def values(self, maps: list[TyingMap]) -> torch.Tensor:
        """The map part of the value of each map (the trend is common to all maps at one time)."""
        return torch.stack([self.weights[self.map_features(tying_map)].sum() for tying_map in maps])

    @staticmethod
    def trend_features(time: float) -> torch.Tensor:
        return torch.tensor([1.0] + [math.exp(-time / scale) for scale in TREND_TIME_SCALES], dtype=torch.float64)

    def trend(self, time: float) -> float:
        """The fitted trend of the reward at decision `time`: what an average map would get then."""
        return float(self.weights[self.num_map_features :] @ self.trend_features(time))

    def update(self, tying_map: TyingMap, time: float, target: float) -> float:
        """Fold one observation in; returns the prediction error before the update."""
        features = torch.zeros_like(self.moment)
        features[self.map_features(tying_map)] = 1.0
        features[self.num_map_features :] = self.trend_features(time)
        error = target - float(features @ self.weights)
        keep = self.forgetting
        self.precision.mul_(keep).add_(torch.diag(self.prior), alpha=1 - keep)
        self.precision.add_(torch.outer(features, features))
        self.moment.mul_(keep).add_(features, alpha=target)
        self.weights = torch.cholesky_solve(self.moment[:, None], torch.linalg.cholesky(self.precision))[:, 0]
        return error

    def state_dict(self) -> dict:
        return {"precision": self.precision.clone(), "moment": self.moment.clone(), "weights": self.weights.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.precision, self.moment, self.weights = (state[key].clone() for key in ("precision", "moment", "weights"))


def _slice_start(block: int) -> int:
    """Offset of `block`'s slice in the authors' layout: blocks 1..block-1 come first, with 2..block outputs."""
    return block * (block + 1) // 2


class PaperQNetwork(nn.Module):
    """The authors' Q-network: `Linear(L, hidden) -> ReLU -> Linear(hidden, L (L + 1) / 2)`.

    Its input is the map itself, one float per block (the source index), as in the authors' code. Block `i`'s
    `i + 1` Q values are outputs `i (i + 1) / 2 ... i (i + 1) / 2 + i`: index `j < i` ties block `i` to block `j`,
    index `i` keeps it independent. (Output 0 belongs to block 0, which never decides.)
    """

    def __init__(self, num_blocks: int, hidden_size: int):
        super().__init__()
        self.num_blocks = num_blocks
        self.layers = nn.Sequential(
            nn.Linear(num_blocks, hidden_size), nn.ReLU(), nn.Linear(hidden_size, _slice_start(num_blocks))
        )

    def forward(self, tying_map: TyingMap) -> torch.Tensor:
        return self.layers(torch.tensor(tying_map.entries, dtype=torch.float32))

    def block_q_values(self, tying_map: TyingMap, block: int) -> torch.Tensor:
        """The `block + 1` Q values of `block`'s actions in `tying_map`."""
        start = _slice_start(block)
        return self(tying_map)[start : start + block + 1]
