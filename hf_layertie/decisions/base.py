"""`TyingDecisions`, the interface every tying strategy implements; `Observation`, what a strategy sees of the run;
`Decision`, what it returns.

A strategy is a function of what it observes: `TyingTrainer` calls `start`, `decide` (when `is_due`) and `finish`
with an `Observation` and applies, logs and checkpoints what comes back, in one place. A strategy never changes the
run itself: its observation holds read-only values and measurements (of the model: `held_out_loss`,
`block_distances`; over the processes: `mean_over_processes`, `gather`). `decide` runs on every process (the
measurements over processes are collective) and returns the decision on the main process only; the trainer sends it
to the others. A new strategy is one subclass and one entry in `hf_layertie.decisions.DECISIONS`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..dlt import Outcome
from ..models.tying_map import TyingMap


def split_strategy(tying_strategy: str) -> tuple[str, str]:
    """`tying_strategy`'s mode and its argument: `"static:cycle:4"` -> `("static", "cycle:4")`, `"dlt"` -> `("dlt", "")`."""
    mode, _, argument = str(tying_strategy).partition(":")
    return mode, argument


@dataclass(frozen=True)
class Decision:
    """A strategy's tying decision, as the trainer applies, logs and checkpoints it. (A `dlt`/`random` decision is
    made from the agent's own proposal, `hf_layertie.dlt.Proposal`, which knows nothing of training.)

    Args:
        index: its number in the run's history; None for a map applied outside it (the agent's starting map).
        step: the optimizer step from which its map holds.
        map_after: the map it sets.
        map_before: the map it replaces (None when restored from a checkpoint's log, which keeps `map_after` only).
        block, source, explored, epsilon: an agent's action (`block` takes `source`'s weights, drawn at random if
            `explored`, with exploration probability `epsilon`); None for other strategies.
        angular_distances: `similarity:U`: each block's distance the map was chosen from.
        tie_init, lora_rank, lora_init: how the trainer ties the groups (`TiedBlocksMixin.retie`) and relaxes the
            ties (`hf_layertie.relaxed_ties.relax_ties`).
        untie_to_start: the block an agent's action unties takes back the weights it had when training started
            (`untie_init="own"`); other blocks the new map leaves independent keep theirs.
        awaits_outcome: its outcome (window loss and reward) comes with the next decision, or at the end of training.
        outcome: that outcome, once known.
        previous_outcome: the outcome of the decision this one replaces, known now.
        trainable_parameters, block_parameters: the model's counts once the trainer applied it.
        seconds: wall time the strategy spent on it, by part of the tying overhead ("reward", "decision").
    """

    index: int | None
    step: int
    map_after: TyingMap
    map_before: TyingMap | None = None
    block: int | None = None
    source: int | None = None
    explored: bool | None = None
    epsilon: float | None = None
    angular_distances: list[float] | None = None
    tie_init: str = "root"
    lora_rank: int | None = None
    lora_init: str | None = None
    untie_to_start: bool = False
    awaits_outcome: bool = False
    outcome: Outcome | None = None
    previous_outcome: Outcome | None = None
    trainable_parameters: int | None = None
    block_parameters: int | None = None
    seconds: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def completed(self) -> bool:
        """Whether everything about it is known (what `tying_history.jsonl` holds)."""
        return not self.awaits_outcome or self.outcome is not None

    def to_row(self) -> dict:
        """Its JSON-ready log row: `index`, `step`, the action, `map`, `map_text`, `distinct_blocks`, the parameter
        counts, `angular_distances` (similarity), then the outcome: `loss`, `reward`, `advantage`, `q_error`."""
        row = {"index": self.index, "step": self.step}
        if self.block is not None:
            row.update(block=self.block, source=self.source, explored=self.explored, epsilon=self.epsilon)
        row.update(
            map=self.map_after.to_list(),
            map_text=self.map_after.render(),
            distinct_blocks=self.map_after.num_distinct,
            trainable_parameters=self.trainable_parameters,
            block_parameters=self.block_parameters,
        )
        if self.angular_distances is not None:
            row["angular_distances"] = list(self.angular_distances)
        if self.outcome is not None:
            row.update(dataclasses.asdict(self.outcome))
        return row

    @classmethod
    def from_row(cls, row: dict, pending: bool = False) -> Decision:
        """The decision a log row describes (`to_row`; `pending`: it awaits its outcome)."""
        outcome = None
        if "reward" in row:
            outcome = Outcome(**{name.name: row[name.name] for name in dataclasses.fields(Outcome)})
        action = {name: row[name] for name in ("block", "source", "explored", "epsilon") if name in row}
        return cls(
            index=row["index"],
            step=row["step"],
            map_after=TyingMap(row["map"]),
            **action,
            angular_distances=row.get("angular_distances"),
            awaits_outcome=pending or outcome is not None,
            outcome=outcome,
            trainable_parameters=row.get("trainable_parameters"),
            block_parameters=row.get("block_parameters"),
        )


@dataclass(frozen=True)
class Observation:
    """The run as a strategy sees it when the trainer calls it: values, and measurements that change nothing.

    Args:
        step: the optimizer step about to be taken.
        max_steps: the run's optimizer steps (0 before training starts).
        tying_map: the model's map now (None for a model without tied blocks).
        current: the last decision of the run's history (None before the first).
        is_main_process, process_index, num_processes: where this process stands.
        held_out_loss: the loss of the fixed held-out reward batch (main process only).
        block_distances: each block's angular distance on the current batch (`hf_layertie.block_similarity`; main
            process only).
        mean_over_processes: the mean of a value over processes (collective: every process calls it).
        gather: a value of every process, by rank (collective).
    """

    step: int
    max_steps: int
    tying_map: TyingMap | None
    current: Decision | None
    is_main_process: bool
    process_index: int
    num_processes: int
    held_out_loss: Callable[[], float]
    block_distances: Callable[[], list[float]]
    mean_over_processes: Callable[[float], float]
    gather: Callable[[float], list[float]]


@dataclass(frozen=True)
class StrategySettings:
    """The settings a strategy reads, resolved and checked: all it receives of the run's arguments.

    Each strategy's subclass adds a field per `TyingTrainingArguments` setting it reads, with the value it takes when
    left unset (`None`: stays unset, or is resolved from another setting by `resolved_settings`). The flat flags of
    `TyingTrainingArguments` stay what `HfArgumentParser` parses; this is the strategy's typed view of them.

    Attributes:
        tying_strategy: the spec that chose the strategy (`"similarity:4"`), for its argument and its messages.
    """

    tying_strategy: str = "none"

    @property
    def argument(self) -> str:
        """What follows `mode:` in `tying_strategy` (`"4"` for `similarity:4`), "" for none."""
        return split_strategy(self.tying_strategy)[1]


class TyingDecisions:
    """Base of every strategy: no decision ever (conventional training, `tying_strategy="none"`).

    Class attributes:
        mode: the `tying_strategy` word that selects the class ("dlt", "static", ...).
        argument: what follows `mode:` in `tying_strategy` (`"U"` for `similarity:U`), None for a strategy that
            takes none.
        Settings: the strategy's settings (a frozen `StrategySettings` subclass): the `TyingTrainingArguments`
            fields it reads, each with the value it takes when left unset (`setting_defaults`).
            `TyingTrainingArguments` refuses every other tying setting, fills these defaults, and a resumed run must
            repeat them. The strategy receives an instance (`settings_from`) as `self.settings`, not the arguments.
        state_keys: the keys `state_dict` always writes and `load_state_dict` needs (a checkpoint's tying state is
            refused as a pre-release layout without them: `checkpoint_format.migrate_tying_state`).
        needs_tied_model: whether the model must be a `TiedBlocksMixin` model.
        changes_map: whether the map changes during training (so DDP cannot assume a static graph).
    """

    mode: ClassVar[str] = "none"
    argument: ClassVar[str | None] = None
    Settings: ClassVar[type[StrategySettings]] = StrategySettings
    state_keys: ClassVar[tuple[str, ...]] = ()
    needs_tied_model: ClassVar[bool] = False
    changes_map: ClassVar[bool] = False

    @classmethod
    def form(cls) -> str:
        """How `tying_strategy` selects the strategy: `dlt`, `similarity:U`, ..."""
        return cls.mode if cls.argument is None else f"{cls.mode}:{cls.argument}"

    def __init__(self, settings: StrategySettings, num_blocks: int):
        if not isinstance(settings, self.Settings):
            raise TypeError(f"{type(self).__name__} takes its {self.Settings.__name__} (see settings_from), got {type(settings).__name__}")
        self.settings = settings
        self.num_blocks = num_blocks

    @classmethod
    def setting_defaults(cls) -> dict[str, Any]:
        """The `TyingTrainingArguments` fields the strategy reads, each with the value it takes when left unset."""
        return {item.name: item.default for item in dataclasses.fields(cls.Settings) if item.name != "tying_strategy"}

    @classmethod
    def resolved_settings(cls, args) -> dict[str, Any]:
        """The value of every setting the strategy reads, checked: `args`' own, else its default (from `Settings`,
        or from other settings, e.g. `agent_seed` from `seed`). `args` are read, never written:
        `TyingTrainingArguments` takes these values once it has refused the settings the strategy does not read."""
        return {name: default if getattr(args, name) is None else getattr(args, name) for name, default in cls.setting_defaults().items()}

    @property
    def lora_rank(self) -> int | None:
        """The rank of the relaxed ties' adapters the strategy's map is given (fixed maps only), None for none."""
        return None

    @classmethod
    def settings_from(cls, args) -> StrategySettings:
        """The strategy's settings as `args` (a `TyingTrainingArguments`, whose strategy settings are resolved when
        it is built) hold them."""
        return cls.Settings(tying_strategy=args.tying_strategy, **{name: getattr(args, name) for name in cls.setting_defaults()})

    def start(self, observation: Observation) -> Decision | None:
        """The map training starts from, if the strategy has one (on every process: the same everywhere)."""
        return None

    def check_run(self, max_steps: int) -> None:
        """Called before the first step, when the run's length is known: refuse a run the strategy cannot serve."""

    def is_due(self, step: int, current: Decision | None) -> bool:
        """Whether a decision is taken before optimizer step `step`; `current` is the last one taken."""
        return False

    def observe_loss(self, loss: torch.Tensor) -> None:
        """Every training micro-batch's loss (as the Trainer returns it)."""

    def decide(self, observation: Observation) -> Decision | None:
        """The decision that is due: called on every process at the same step, returned on the main process."""
        raise NotImplementedError(f"{type(self).__name__} takes no decisions")

    def finish(self, observation: Observation) -> Outcome | None:
        """Training ended: the outcome of the current decision, if it awaits one (returned on the main process)."""
        return None

    def state_dict(self, observation: Observation) -> dict:
        """What a checkpoint keeps besides the run's decisions (which the trainer keeps); may be collective."""
        return {}

    def load_state_dict(self, state: dict, observation: Observation) -> None:
        """Restore what `state_dict` returned."""
