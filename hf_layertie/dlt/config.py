"""`AgentConfig`: every setting of the tying agent, its defaults and its validation, in one place.

Two variants share the decision loop (one block per decision, blocks in turn, epsilon-greedy over the
block's options, the all-tied start) and differ in what learns from the rewards:

- `"default"`: a linear value of the map reached by an action (its "afterstate"), fitted by recursive least
  squares with forgetting over every decision so far, jointly with a local time trend of the loss. Chosen by
  measurement on `hf_layertie.dlt.synthetic` for runs of hundreds of decisions (see `hf_layertie/dlt/README.md`).
- `"paper"`: Hay & Wolf's agent as the authors' code runs it: an MLP Q-network over the raw map with one
  output slice per block, one online TD update per decision (AdamW, MSE), reward `clip(-perplexity, -10, 10)`.

Fields left at `None` take the variant's value from `VARIANT_DEFAULTS`; a field that the variant does not use
must stay `None`, so that no setting is silently ignored.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from numbers import Integral, Real

VARIANTS = ("default", "paper")

# The value every `None` field takes, per variant. A key missing from a variant's table means "not used".
VARIANT_DEFAULTS: dict[str, dict[str, float | int]] = {
    "default": {
        "gamma": 0.0,
        "epsilon_start": 1.0,
        "epsilon_min": 0.0,
        "exploration_fraction": 0.8,
        "forgetting": 0.98,
        "ridge": 1.0,
    },
    "paper": {
        "gamma": 0.99,
        "epsilon_start": 1.0,
        "epsilon_min": 0.1,
        "epsilon_decay": 0.95,
        "hidden_size": 128,
        "learning_rate": 1e-3,
        "weight_decay": 0.01,
    },
}
_TUNABLE = tuple(sorted({name for defaults in VARIANT_DEFAULTS.values() for name in defaults}))


@dataclass
class AgentConfig:
    """Settings of `TyingAgent` (see the module docstring for the two variants).

    Args:
        variant: `"default"` or `"paper"`; picks the value of every field left at `None`.
        max_distinct_blocks: hard cap on blocks that own weights, enforced by removing every option that would
            exceed it, so the training memory never grows past it. `None`: no cap.
        gamma: discount of future rewards. default 0.0: with a few hundred decisions bootstrapped targets only
            added variance on the synthetic problems (0.5, 0.8 and 0.9 found the best map less often); paper 0.99.
        epsilon_start, epsilon_min: exploration probability at the start and its floor (default 1.0 and 0.0;
            paper 1.0 and 0.1).
        epsilon_decay: paper only: factor applied to epsilon after every sweep over blocks 1..L-1 (0.95).
        exploration_fraction: default only: epsilon falls linearly from `epsilon_start` to `epsilon_min` over
            this share of the run's decisions, then the agent exploits what it learned (0.8). The paper's decay
            per sweep ignores the run's length; with hundreds of decisions it either stops exploring too early
            or is still exploring when training ends, and the final map is what the user keeps.
        forgetting: default only: weight factor per decision of the least-squares fit (0.98, a memory of about
            50 decisions): the model being trained changes, so old rewards say less about the current one.
        ridge: default only: prior precision of the least-squares weights (1.0).
        hidden_size, learning_rate, weight_decay: paper only: width of the Q-network's single hidden layer (128)
            and its AdamW settings (1e-3, 0.01), as in the authors' code.
        seed: seed of the agent's own random generator (initialisation and exploration).

    Raises:
        ValueError: naming the field, its value and what was expected.
    """

    variant: str = "default"
    max_distinct_blocks: int | None = None
    gamma: float | None = None
    epsilon_start: float | None = None
    epsilon_min: float | None = None
    epsilon_decay: float | None = None
    exploration_fraction: float | None = None
    forgetting: float | None = None
    ridge: float | None = None
    hidden_size: int | None = None
    learning_rate: float | None = None
    weight_decay: float | None = None
    seed: int = 0

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(map(repr, VARIANTS))}, got {self.variant!r}")
        defaults = VARIANT_DEFAULTS[self.variant]
        for name in _TUNABLE:
            value = getattr(self, name)
            if name not in defaults and value is not None:
                users = [variant for variant, table in VARIANT_DEFAULTS.items() if name in table]
                raise ValueError(f"{name} is only used by variant {' and '.join(map(repr, users))}, not {self.variant!r}")
            if value is None and name in defaults:
                setattr(self, name, defaults[name])
        self._validate()

    def _validate(self) -> None:
        _check_integer("seed", self.seed)
        if self.max_distinct_blocks is not None:
            _check_integer("max_distinct_blocks", self.max_distinct_blocks, minimum=1)
        _check_real("gamma", self.gamma, 0.0, 1.0)
        _check_real("epsilon_start", self.epsilon_start, 0.0, 1.0)
        _check_real("epsilon_min", self.epsilon_min, 0.0, 1.0)
        if self.epsilon_min > self.epsilon_start:
            raise ValueError(
                f"epsilon_min ({self.epsilon_min}) must not exceed epsilon_start ({self.epsilon_start}): epsilon only decays"
            )
        checks = {
            "epsilon_decay": lambda value: _check_real("epsilon_decay", value, 0.0, 1.0, low_open=True),
            "exploration_fraction": lambda value: _check_real("exploration_fraction", value, 0.0, 1.0, low_open=True),
            "forgetting": lambda value: _check_real("forgetting", value, 0.0, 1.0, low_open=True),
            "ridge": lambda value: _check_real("ridge", value, 0.0, math.inf, low_open=True, high_open=True),
            "hidden_size": lambda value: _check_integer("hidden_size", value, minimum=1),
            "learning_rate": lambda value: _check_real("learning_rate", value, 0.0, math.inf, low_open=True, high_open=True),
            "weight_decay": lambda value: _check_real("weight_decay", value, 0.0, math.inf, high_open=True),
        }
        for name, check in checks.items():
            if getattr(self, name) is not None:
                check(getattr(self, name))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _check_integer(name: str, value, minimum: int | None = None) -> None:
    in_range = minimum is None or (isinstance(value, Integral) and value >= minimum)
    if isinstance(value, bool) or not isinstance(value, Integral) or not in_range or abs(int(value)) >= 2**63:
        bound = "" if minimum is None else f" >= {minimum}"
        raise ValueError(f"{name} must be an integer{bound} (and below 2**63), got {value!r}")


def _check_real(name: str, value, low: float, high: float, low_open: bool = False, high_open: bool = False) -> None:
    """Raise unless `value` is a real number between `low` and `high` (each bound excluded when open)."""
    is_real = isinstance(value, Real) and not isinstance(value, bool)
    above = is_real and (value > low if low_open else value >= low)
    below = is_real and (value < high if high_open else value <= high)
    if not (above and below):
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be a number in {interval}, got {value!r}")
