"""`AgentConfig`: every setting of the tying agent, its defaults and its validation, in one place.

Two variants share the decision loop (one block per decision, blocks in turn, epsilon-greedy over the
block's options, the all-tied start) and differ in what learns from the rewards:

- `"default"`: a linear value of the map reached by an action (its "afterstate"), fitted by recursive least
  squares with forgetting over every decision so far, jointly with a trend of the loss over time (a constant
  and decaying exponentials, `hf_layertie.dlt.value`). Chosen by
  measurement on `hf_layertie.dlt.synthetic` for runs of hundreds of decisions (see `hf_layertie/dlt/README.md`).
- `"paper"`: Hay & Wolf's agent as the authors' code runs it: an MLP Q-network over the raw map with one
  output slice per block, one online TD update per decision (AdamW, MSE), reward `clip(-perplexity, -10, 10)`.

Fields left at `None` take the variant's value from `VARIANT_DEFAULTS`; a field that the variant does not use
must stay `None`, so that no setting is silently ignored. Each setting is declared once, in `AgentSettings`, which
both `AgentConfig` and `TyingTrainingArguments` (the command line) inherit.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from ..checks import check_integer, check_real

VARIANTS = ("default", "paper")

# The value every `None` field takes, per variant. A key missing from a variant's table means "not used".
VARIANT_DEFAULTS: dict[str, dict[str, float | int]] = {
    "default": {
        "q_gamma": 0.0,
        "epsilon_start": 1.0,
        "epsilon_min": 0.0,
        "exploration_fraction": 0.8,
        "q_forgetting": 0.98,
        "q_ridge": 1.0,
    },
    "paper": {
        "q_gamma": 0.99,
        "epsilon_start": 1.0,
        "epsilon_min": 0.1,
        "epsilon_decay": 0.95,
        "q_hidden_size": 128,
        "q_learning_rate": 1e-3,
        "q_weight_decay": 0.01,
    },
}
_TUNABLE = tuple(sorted({name for defaults in VARIANT_DEFAULTS.values() for name in defaults}))
# The smallest q_ridge accepted (`AgentConfig._validate`).
MIN_Q_RIDGE = 1e-6


def _variant_help(name: str) -> str:
    values = [f"{variant}: {table[name]}" for variant, table in VARIANT_DEFAULTS.items() if name in table]
    return f"None = the variant's value ({'; '.join(values)})."


def _setting(help_text: str, choices: tuple[str, ...] | None = None) -> dataclasses.Field:
    """Unset by default; `choices` reach argparse, which validates the flag and lists them in `--help`."""
    return field(default=None, metadata={"help": help_text, **({"choices": choices} if choices else {})})


@dataclass
class AgentSettings:
    """The agent's settings as given, each declared once: `AgentConfig` resolves and checks them, and
    `TyingTrainingArguments` takes them from the command line under the same names. `None` takes the default
    (`AgentConfig`); the fields are documented there."""

    dlt_variant: str | None = _setting("the agent, 'default' or 'paper'.", VARIANTS)
    max_distinct_blocks: int | None = _setting("hard cap on blocks owning weights (training memory) at every step.")
    q_gamma: float | None = _setting(f"discount of future rewards. {_variant_help('q_gamma')}")
    epsilon_start: float | None = _setting(f"initial exploration rate. {_variant_help('epsilon_start')}")
    epsilon_min: float | None = _setting(f"exploration floor. {_variant_help('epsilon_min')}")
    epsilon_decay: float | None = _setting(f"paper agent: exploration factor per sweep. {_variant_help('epsilon_decay')}")
    exploration_fraction: float | None = _setting(
        f"default agent: share of decisions over which epsilon falls. {_variant_help('exploration_fraction')}"
    )
    q_forgetting: float | None = _setting(f"default agent: least-squares forgetting. {_variant_help('q_forgetting')}")
    q_ridge: float | None = _setting(f"default agent: prior precision, at least 1e-6. {_variant_help('q_ridge')}")
    q_hidden_size: int | None = _setting(f"paper agent: Q-network hidden width. {_variant_help('q_hidden_size')}")
    q_learning_rate: float | None = _setting(f"paper agent: Q-network learning rate. {_variant_help('q_learning_rate')}")
    q_weight_decay: float | None = _setting(f"paper agent: Q-network weight decay. {_variant_help('q_weight_decay')}")
    agent_seed: int | None = _setting("seed of the agent's own generator (default: the run's --seed; AgentConfig alone: 0).")


@dataclass
class AgentConfig(AgentSettings):
    """Settings of `TyingAgent` (see the module docstring for the two variants).

    Every field is an `AgentSettings` field, the name of its `TyingTrainingArguments` / command-line flag too, so one
    name means one setting.

    Args:
        dlt_variant: `"default"` (when `None`) or `"paper"`; picks the value of every field left at `None`.
        max_distinct_blocks: hard cap on blocks that own weights, enforced by removing every option that would
            exceed it, so the training memory never grows past it. `None`: no cap.
        q_gamma: discount of future rewards. default 0.0: with a few hundred decisions bootstrapped targets only
            added variance on the synthetic problems (0.5, 0.8 and 0.9 found the best map less often); paper 0.99.
        epsilon_start, epsilon_min: exploration probability at the start and its floor (default 1.0 and 0.0;
            paper 1.0 and 0.1).
        epsilon_decay: paper only: factor applied to epsilon after every sweep over blocks 1..L-1 (0.95).
        exploration_fraction: default only: epsilon falls linearly from `epsilon_start` to `epsilon_min` over
            this share of the run's decisions, then the agent exploits what it learned (0.8). The paper's decay
            per sweep ignores the run's length; with hundreds of decisions it either stops exploring too early
            or is still exploring when training ends, and the final map is what the user keeps.
        q_forgetting: default only: weight factor per decision of the least-squares fit (0.98, a memory of about
            50 decisions): the model being trained changes, so old rewards say less about the current one.
        q_ridge: default only: prior precision of the least-squares weights (1.0; at least 1e-6).
        q_hidden_size, q_learning_rate, q_weight_decay: paper only: width of the Q-network's single hidden layer (128)
            and its AdamW settings (1e-3, 0.01), as in the authors' code.
        agent_seed: seed of the agent's own random generator (initialisation and exploration). 0 when `None`;
            `TyingTrainingArguments` passes the run's `--seed` unless `--agent_seed` is given.

    Raises:
        ValueError: naming the field, its value and what was expected.
    """

    def __post_init__(self):
        self.dlt_variant = "default" if self.dlt_variant is None else self.dlt_variant
        self.agent_seed = 0 if self.agent_seed is None else self.agent_seed
        if self.dlt_variant not in VARIANTS:
            raise ValueError(f"dlt_variant must be one of {', '.join(map(repr, VARIANTS))}, got {self.dlt_variant!r}")
        defaults = VARIANT_DEFAULTS[self.dlt_variant]
        for name in _TUNABLE:
            value = getattr(self, name)
            if name not in defaults and value is not None:
                users = [variant for variant, table in VARIANT_DEFAULTS.items() if name in table]
                raise ValueError(f"{name} is only used by dlt_variant {' and '.join(map(repr, users))}, not {self.dlt_variant!r}")
            if value is None and name in defaults:
                setattr(self, name, defaults[name])
        self._validate()

    def _validate(self) -> None:
        check_integer("agent_seed", self.agent_seed)
        if self.max_distinct_blocks is not None:
            check_integer("max_distinct_blocks", self.max_distinct_blocks, minimum=1)
        check_real("q_gamma", self.q_gamma, 0.0, 1.0)
        check_real("epsilon_start", self.epsilon_start, 0.0, 1.0)
        check_real("epsilon_min", self.epsilon_min, 0.0, 1.0)
        if self.epsilon_min > self.epsilon_start:
            raise ValueError(
                f"epsilon_min ({self.epsilon_min}) must not exceed epsilon_start ({self.epsilon_start}): epsilon only decays"
            )
        checks = {
            "epsilon_decay": lambda value: check_real("epsilon_decay", value, 0.0, 1.0, low_open=True),
            "exploration_fraction": lambda value: check_real("exploration_fraction", value, 0.0, 1.0, low_open=True),
            "q_forgetting": lambda value: check_real("q_forgetting", value, 0.0, 1.0, low_open=True),
            # Too small a prior lets the trend's fading features make the least squares' float64 factorisation
            # fail (`AfterstateValue`: 1e-8 failed at decision 20 on 8 blocks; 1e-6 runs 400 decisions).
            "q_ridge": lambda value: check_real("q_ridge", value, MIN_Q_RIDGE, math.inf, high_open=True),
            "q_hidden_size": lambda value: check_integer("q_hidden_size", value, minimum=1),
            "q_learning_rate": lambda value: check_real("q_learning_rate", value, 0.0, math.inf, low_open=True, high_open=True),
            "q_weight_decay": lambda value: check_real("q_weight_decay", value, 0.0, math.inf, high_open=True),
        }
        for name, check in checks.items():
            if getattr(self, name) is not None:
                check(getattr(self, name))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

