"""`TyingTrainingArguments`: every knob of Dynamic Layer Tying, next to the Trainer that reads them."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import TrainingArguments

from ..models.tying_strategies import check_strategy_spec

TYING_MODES = ("dlt", "random", "static", "none")


@dataclass
class TyingTrainingArguments(TrainingArguments):
    r"""
    [`TrainingArguments`] plus the tying method. Defaults follow Hay & Wolf (ICLR 2024) where the paper
    gives a value.

    tying_strategy (`str`, defaults to `"dlt"`):
        `dlt`: a Q-learning agent decides the map (the method). `random`: the same schedule with uniformly
        random actions (ablation). `static:<spec>`: a fixed map from a strategy (`static:all`, `static:cycle:4`,
        `static:sequence:3`, `static:cycle_rev:3`, `static:sandwich`, `static:independent`). `none`:
        conventional training, no tying code runs (also on plain transformers models).
    tying_initial_map (`str`, *optional*):
        The map `dlt` and `random` start from: a strategy spec (`"all"`) or explicit entries (`"0 0 2 2"`).
        Defaults to every block independent, as in the paper.
    tying_interval (`int`, defaults to 15):
        k, optimizer steps between two decisions. The reward of a decision is measured k steps after it.
    q_hidden_size (`int`, defaults to 128):
        Width of the Q-network's hidden layer (the paper does not state it).
    q_learning_rate (`float`, defaults to 1e-3), q_gamma (`float`, defaults to 0.99):
        Adam learning rate and discount of the Q-learning agent.
    epsilon_start / epsilon_decay / epsilon_min (`float`, defaults to 1.0 / 0.95 / 0.1):
        Epsilon-greedy exploration; epsilon decays once per sweep over blocks 1..L-1.
    reward_measure (`str`, defaults to `"improvement"`):
        The quality part of the reward: `"improvement"`, the held-out loss when the action was taken minus the
        held-out loss k steps later, or `"loss"`, minus the held-out loss k steps later. Both carry signal at every
        stage of training (the authors' -perplexity clipped to [-10, 10] is constant while perplexity > 10);
        `"improvement"` also removes the steady fall of the loss over training, which otherwise makes every map
        visited late look better than every map visited early (see `hf_layertie.dlt.reward`).
    reward_block_cost (`float`, defaults to 0.01):
        Nats of held-out loss the user is willing to pay per distinct block: the reward is
        `quality - reward_block_cost * distinct_blocks` (minus the budget term). 0 optimises quality only.
    reward_distinct_budget (`int`, *optional*) and reward_budget_penalty (`float`, defaults to 1.0):
        A soft budget: every distinct block above the budget costs `reward_budget_penalty` nats more.
    reward_batch_size (`int`, defaults to 16):
        Held-out examples (the first ones of the reward dataset, fixed for the whole run) whose loss is the reward.
    agent_seed (`int`, *optional*):
        Seed of the agent's own random generator; defaults to `seed`.
    tying_plot (`bool`, defaults to `True`):
        Write `tying_map.png` (blocks x steps, one colour per source block) next to saved models.
    """

    tying_strategy: str = field(default="dlt", metadata={"help": "dlt | random | static:<spec> | none"})
    tying_initial_map: str | None = field(
        default=None, metadata={"help": "Start map for dlt/random: a strategy spec ('all') or entries ('0 0 2 2')."}
    )
    tying_interval: int = field(default=15, metadata={"help": "k: optimizer steps between two tying decisions."})
    q_hidden_size: int = field(default=128, metadata={"help": "Hidden width of the Q-network MLP."})
    q_learning_rate: float = field(default=1e-3, metadata={"help": "Adam learning rate of the Q-network."})
    q_gamma: float = field(default=0.99, metadata={"help": "Discount factor of the Q-learning target."})
    epsilon_start: float = field(default=1.0, metadata={"help": "Initial exploration rate."})
    epsilon_decay: float = field(default=0.95, metadata={"help": "Exploration decay per sweep over the blocks."})
    epsilon_min: float = field(default=0.1, metadata={"help": "Exploration floor."})
    reward_measure: str = field(
        default="improvement", metadata={"help": "Reward quality term: 'improvement' (loss drop over k steps) or 'loss'."}
    )
    reward_block_cost: float = field(
        default=0.01, metadata={"help": "Reward cost in nats per distinct (trainable) block."}
    )
    reward_distinct_budget: int | None = field(
        default=None, metadata={"help": "Soft budget of distinct blocks; each block above costs reward_budget_penalty."}
    )
    reward_budget_penalty: float = field(default=1.0, metadata={"help": "Nats per distinct block above the budget."})
    reward_batch_size: int = field(default=16, metadata={"help": "Held-out examples whose loss gives the reward."})
    agent_seed: int | None = field(default=None, metadata={"help": "Seed of the agent (defaults to --seed)."})
    tying_plot: bool = field(default=True, metadata={"help": "Write tying_map.png next to saved models."})

    def __post_init__(self):
        super().__post_init__()
        self._check_tying_arguments()
        if self.agent_seed is None:
            self.agent_seed = self.seed

    @property
    def tying_mode(self) -> str:
        """`dlt`, `random`, `static` or `none`."""
        return self.tying_strategy.split(":", 1)[0]

    @property
    def static_spec(self) -> str | None:
        """The strategy spec of `static:<spec>`, else `None`."""
        return self.tying_strategy.partition(":")[2] if self.tying_mode == "static" else None

    @property
    def is_dynamic(self) -> bool:
        return self.tying_mode in ("dlt", "random")

    def _check_tying_arguments(self) -> None:
        mode = self.tying_mode
        if mode not in TYING_MODES:
            raise ValueError(
                f"tying_strategy={self.tying_strategy!r}: expected 'dlt', 'random', 'static:<spec>' or 'none'"
            )
        if mode == "static":
            if not self.static_spec:
                raise ValueError("tying_strategy='static' needs a map spec, e.g. 'static:cycle:4' or 'static:all'")
            try:
                check_strategy_spec(self.static_spec)
            except ValueError as error:
                raise ValueError(f"tying_strategy={self.tying_strategy!r}: {error}") from None
        elif ":" in self.tying_strategy:
            raise ValueError(f"tying_strategy={self.tying_strategy!r}: only 'static' takes a ':<spec>' part")
        if self.tying_initial_map is not None and not self.is_dynamic:
            raise ValueError(f"tying_initial_map is only used by 'dlt' and 'random', not by {self.tying_strategy!r}")
        checks = [
            ("reward_measure", self.reward_measure in ("improvement", "loss"), "'improvement' or 'loss'"),
            ("tying_interval", self.tying_interval >= 1, "an integer >= 1"),
            ("q_hidden_size", self.q_hidden_size >= 1, "an integer >= 1"),
            ("q_learning_rate", self.q_learning_rate > 0, "> 0"),
            ("q_gamma", 0.0 <= self.q_gamma <= 1.0, "in [0, 1]"),
            ("epsilon_start", 0.0 <= self.epsilon_start <= 1.0, "in [0, 1]"),
            ("epsilon_decay", 0.0 < self.epsilon_decay <= 1.0, "in (0, 1]"),
            ("epsilon_min", 0.0 <= self.epsilon_min <= 1.0, "in [0, 1]"),
            ("reward_block_cost", self.reward_block_cost >= 0, ">= 0"),
            ("reward_budget_penalty", self.reward_budget_penalty >= 0, ">= 0"),
            ("reward_distinct_budget", self.reward_distinct_budget is None or self.reward_distinct_budget >= 1, ">= 1"),
            ("reward_batch_size", self.reward_batch_size >= 1, "an integer >= 1"),
        ]
        for name, valid, expected in checks:
            if not valid:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: expected {expected}")
