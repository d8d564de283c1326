"""`TyingTrainingArguments`: the tying method's command-line settings, next to the Trainer that reads them.

The agent's settings live in `hf_layertie.dlt.AgentConfig` and the reward's in `hf_layertie.dlt.TyingReward`,
which own their defaults and validation; the fields here are their command-line names, and errors are
re-raised under those names.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from transformers import TrainingArguments

from ..dlt import VARIANT_DEFAULTS, VARIANTS, AgentConfig, TyingReward
from ..dlt.config import _check_integer
from ..models.tying_strategies import check_static_spec

TYING_MODES = ("dlt", "random", "static", "similarity", "none")
REWARD_SOURCES = ("train", "held_out")
# AgentConfig field -> command-line name.
AGENT_ARGUMENTS = {
    "variant": "dlt_variant",
    "max_distinct_blocks": "max_distinct_blocks",
    "gamma": "q_gamma",
    "epsilon_start": "epsilon_start",
    "epsilon_min": "epsilon_min",
    "epsilon_decay": "epsilon_decay",
    "exploration_fraction": "exploration_fraction",
    "forgetting": "q_forgetting",
    "ridge": "q_ridge",
    "hidden_size": "q_hidden_size",
    "learning_rate": "q_learning_rate",
    "weight_decay": "q_weight_decay",
    "seed": "agent_seed",
}


def _variant_help(name: str) -> str:
    values = [f"{variant}: {table[name]}" for variant, table in VARIANT_DEFAULTS.items() if name in table]
    return f"None = the variant's value ({'; '.join(values)})."


@dataclass
class TyingTrainingArguments(TrainingArguments):
    r"""
    [`TrainingArguments`] plus the tying method (see `hf_layertie.dlt` for the agent and the README for every choice).

    tying_strategy (`str`, defaults to `"dlt"`):
        `dlt`: a learning agent decides the map (the method). `random`: the same schedule, options and cap with
        uniformly random actions (ablation). `static:<spec>`: a fixed map, from a strategy (`static:all`,
        `static:cycle:4`, `static:sequence:3`, ...) or explicit entries (`static:0,0,2,2`). `similarity:U`: after
        `similarity_warmup_steps` steps with every block independent, tie blocks by their functional similarity
        to U distinct blocks (`hf_layertie.block_similarity`). `none`: conventional training, no tying code runs.
    dlt_variant (`str`, defaults to `"default"`):
        The agent of `dlt` and the options of `random`: `"default"` (this library's agent) or `"paper"` (Hay & Wolf's
        algorithm as the authors' code runs it; see `hf_layertie.dlt.config`).
    tying_initial_map (`str`, *optional*):
        The map `dlt` and `random` start from: a strategy spec or entries. Defaults to every block tied to block 0,
        as in the paper: the memory saving comes from that start.
    tying_interval (`int`, defaults to 15):
        k, optimizer steps between two decisions (the paper's 15). A decision's reward is the loss of the k steps after it.
    max_distinct_blocks (`int`, *optional*):
        Hard cap on blocks that own weights at every step (so on training memory): options beyond it are never offered.
    q_gamma, epsilon_start, epsilon_min, epsilon_decay, exploration_fraction, q_forgetting, q_ridge, q_hidden_size,
    q_learning_rate, q_weight_decay (*optional*):
        The agent's settings (`AgentConfig`'s `gamma`, ..., `weight_decay`); None takes the variant's value.
    reward_source (`str`, defaults to `"train"`):
        The loss a decision is rewarded with: `"train"`, the mean training loss of the k steps after it (free: each
        batch is scored before the model trains on it), or `"held_out"`, the loss of a fixed held-out batch after
        them (costs a forward pass of `reward_batch_size` examples per decision, in micro-batch-sized chunks).
    reward_block_cost (`float`, defaults to 0.0):
        Nats of loss one more block owning weights is worth to you (`TyingReward.block_cost`).
    reward_batch_size (`int`, defaults to 16):
        `reward_source="held_out"`: examples of the reward dataset (its first ones, fixed for the run) scored per decision.
    agent_seed (`int`, *optional*):
        Seed of the agent's own generator; defaults to `seed`.
    similarity_warmup_steps (`int`, defaults to 0):
        `similarity:U`: steps trained with every block independent before the blocks are compared (0 measures the
        model as loaded, e.g. a converted pretrained checkpoint; a model trained from scratch needs a warm-up).
    tying_plot (`bool`, defaults to `True`):
        Write `tying_map.png` (blocks x steps, one colour per source block) next to saved models.

    A run resumed from a checkpoint must repeat the settings of the run that saved it (`resume_settings()`);
    `TyingTrainer` refuses it otherwise, naming each setting that differs.
    """

    tying_strategy: str = field(
        default="dlt", metadata={"help": "dlt | random | static:<spec or entries> | similarity:U | none"}
    )
    dlt_variant: str = field(default="default", metadata={"help": "Agent of dlt: 'default' or 'paper'."})
    tying_initial_map: str | None = field(
        default=None, metadata={"help": "Start map of dlt/random: a spec ('all') or entries ('0 0 2 2'). Default: all tied."}
    )
    tying_interval: int = field(default=15, metadata={"help": "k: optimizer steps between two tying decisions."})
    max_distinct_blocks: int | None = field(
        default=None, metadata={"help": "Hard cap on blocks owning weights (training memory) at every step."}
    )
    q_gamma: float | None = field(default=None, metadata={"help": f"Discount of future rewards. {_variant_help('gamma')}"})
    epsilon_start: float | None = field(
        default=None, metadata={"help": f"Initial exploration rate. {_variant_help('epsilon_start')}"}
    )
    epsilon_min: float | None = field(default=None, metadata={"help": f"Exploration floor. {_variant_help('epsilon_min')}"})
    epsilon_decay: float | None = field(
        default=None, metadata={"help": f"Paper: exploration factor per sweep. {_variant_help('epsilon_decay')}"}
    )
    exploration_fraction: float | None = field(
        default=None,
        metadata={"help": f"Default: share of decisions over which epsilon falls. {_variant_help('exploration_fraction')}"},
    )
    q_forgetting: float | None = field(
        default=None, metadata={"help": f"Default: least-squares forgetting per decision. {_variant_help('forgetting')}"}
    )
    q_ridge: float | None = field(default=None, metadata={"help": f"Default: prior precision. {_variant_help('ridge')}"})
    q_hidden_size: int | None = field(
        default=None, metadata={"help": f"Paper: Q-network hidden width. {_variant_help('hidden_size')}"}
    )
    q_learning_rate: float | None = field(
        default=None, metadata={"help": f"Paper: Q-network AdamW learning rate. {_variant_help('learning_rate')}"}
    )
    q_weight_decay: float | None = field(
        default=None, metadata={"help": f"Paper: Q-network AdamW weight decay. {_variant_help('weight_decay')}"}
    )
    reward_source: str = field(default="train", metadata={"help": "'train' (free) or 'held_out' (a fixed batch)."})
    reward_block_cost: float = field(default=0.0, metadata={"help": "Reward cost in nats per block owning weights."})
    reward_batch_size: int = field(default=16, metadata={"help": "reward_source='held_out': examples scored."})
    agent_seed: int | None = field(default=None, metadata={"help": "Seed of the agent (defaults to --seed)."})
    similarity_warmup_steps: int = field(
        default=0, metadata={"help": "similarity:U: independent steps before the blocks are compared."}
    )
    tying_plot: bool = field(default=True, metadata={"help": "Write tying_map.png next to saved models."})

    def __post_init__(self):
        super().__post_init__()
        if self.agent_seed is None:
            self.agent_seed = self.seed
        self._check_tying_arguments()

    @classmethod
    def tying_fields(cls) -> list[str]:
        """The names this class adds to `TrainingArguments` (what a model card lists as the tying set-up)."""
        own = {item.name for item in dataclasses.fields(TrainingArguments)}
        return [item.name for item in dataclasses.fields(cls) if item.name not in own]

    @property
    def tying_mode(self) -> str:
        """`dlt`, `random`, `static`, `similarity` or `none`."""
        return self.tying_strategy.split(":", 1)[0]

    @property
    def strategy_argument(self) -> str | None:
        """What follows `static:` or `similarity:`, else None."""
        return self.tying_strategy.partition(":")[2] if self.tying_mode in ("static", "similarity") else None

    @property
    def is_dynamic(self) -> bool:
        """Whether an agent (learning or random) changes the map during training."""
        return self.tying_mode in ("dlt", "random")

    @property
    def similarity_distinct_blocks(self) -> int:
        return int(self.strategy_argument)

    def resume_settings(self) -> dict[str, object]:
        """The settings a run resumed from a checkpoint must share with the run that saved it, by name.

        They decide what the strategy does from the checkpoint on, and the model card reports them: a resumed run
        continues the saved map and agent, so another strategy, schedule, cap, agent or reward would silently not
        be the one that ran. Settings this strategy never reads, and `tying_plot`, may differ.
        """
        names = ["tying_strategy"]
        if self.is_dynamic:
            names += ["tying_initial_map", "tying_interval", *AGENT_ARGUMENTS.values()]
            names += ["reward_source", "reward_block_cost"]
            if self.reward_source == "held_out":
                names.append("reward_batch_size")
        elif self.tying_mode == "similarity":
            names.append("similarity_warmup_steps")
        return {name: getattr(self, name) for name in names}

    def agent_config(self) -> AgentConfig:
        """The agent's settings (validated when these arguments were built)."""
        values = {name: getattr(self, argument) for name, argument in AGENT_ARGUMENTS.items()}
        try:
            return AgentConfig(**values)
        except ValueError as error:
            raise ValueError(_command_line_names(str(error), AGENT_ARGUMENTS)) from None

    def tying_reward(self) -> TyingReward:
        try:
            return TyingReward.for_variant(self.dlt_variant, block_cost=self.reward_block_cost)
        except ValueError as error:
            raise ValueError(_command_line_names(str(error), {"block_cost": "reward_block_cost"})) from None

    def _check_tying_arguments(self) -> None:
        for name in ("tying_strategy", "dlt_variant", "reward_source"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string, got {getattr(self, name)!r}")
        if self.tying_initial_map is not None and not isinstance(self.tying_initial_map, str):
            raise ValueError(f"tying_initial_map must be a string such as 'all' or '0 0 2 2', got {self.tying_initial_map!r}")
        self._check_strategy()
        if self.dlt_variant not in VARIANTS:
            raise ValueError(f"dlt_variant={self.dlt_variant!r}: expected one of {', '.join(map(repr, VARIANTS))}")
        if self.reward_source not in REWARD_SOURCES:
            raise ValueError(f"reward_source={self.reward_source!r}: expected 'train' or 'held_out'")
        for name, minimum in (("tying_interval", 1), ("reward_batch_size", 1), ("similarity_warmup_steps", 0)):
            _check_integer(name, getattr(self, name), minimum=minimum)
        if self.tying_initial_map is not None and not self.is_dynamic:
            raise ValueError(f"tying_initial_map is only used by 'dlt' and 'random', not by {self.tying_strategy!r}")
        if self.is_dynamic:
            self.agent_config()
            self.tying_reward()

    def _check_strategy(self) -> None:
        mode, argument = self.tying_mode, self.strategy_argument
        if mode not in TYING_MODES:
            raise ValueError(
                f"tying_strategy={self.tying_strategy!r}: expected 'dlt', 'random', 'static:<spec>', 'similarity:U' or 'none'"
            )
        if mode in ("static", "similarity") and not argument:
            example = "'static:cycle:4' or 'static:0,0,2,2'" if mode == "static" else "'similarity:4'"
            raise ValueError(f"tying_strategy={self.tying_strategy!r} needs an argument, e.g. {example}")
        if mode == "static":
            try:
                check_static_spec(argument)
            except ValueError as error:
                raise ValueError(f"tying_strategy={self.tying_strategy!r}: {error}") from None
        elif mode == "similarity" and not (argument.isdecimal() and int(argument) >= 1):
            raise ValueError(
                f"tying_strategy={self.tying_strategy!r}: similarity needs the number of distinct blocks, a positive "
                f"integer, as in 'similarity:4'"
            )
        elif mode not in ("static", "similarity") and ":" in self.tying_strategy:
            raise ValueError(f"tying_strategy={self.tying_strategy!r}: only 'static' and 'similarity' take a ':' argument")


def _command_line_names(message: str, names: dict[str, str]) -> str:
    """`message` with every field name replaced by its command-line name."""
    for name, argument in names.items():
        if name != argument:
            message = re.sub(rf"(?<![\w.]){name}\b", argument, message)
    return message
