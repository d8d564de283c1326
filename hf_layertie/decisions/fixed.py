"""Strategies with one decision: a static map from step 0, or a map chosen by block similarity after a warm-up."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..block_similarity import similarity_tying_map
from ..checks import check_choice, check_integer
from ..models.configuration_tying import TIE_INITS
from ..models.tying_map import TyingMap
from ..models.tying_strategies import check_static_spec, positive_integer, resolve_tying_map
from ..relaxed_ties import check_lora_settings
from .base import Decision, Observation, StrategySettings, TyingDecisions, split_strategy


@dataclass(frozen=True)
class StaticSettings(StrategySettings):
    """What `static` reads: how a group of tied blocks starts and the relaxed ties' adapters (see
    `TyingTrainingArguments`)."""

    tie_init: str = "root"
    lora_rank: int | None = None
    lora_init: str | None = None  # "svd" with lora_rank


@dataclass(frozen=True)
class SimilaritySettings(StaticSettings):
    """What `similarity` reads: `static`'s settings and the steps before the blocks are compared."""

    similarity_warmup_steps: int = 0


class _OneDecision(TyingDecisions):
    """A strategy whose one decision is the run's single row."""

    needs_tied_model = True
    Settings = StaticSettings

    @classmethod
    def resolved_settings(cls, args) -> dict[str, Any]:
        values = super().resolved_settings(args)
        check_choice("tie_init", values["tie_init"], TIE_INITS)
        if values["lora_rank"] is not None and values["lora_init"] is None:
            values["lora_init"] = "svd"
        check_lora_settings(values["lora_rank"], values["lora_init"])
        return values

    def _decision(self, observation: Observation, tying_map: TyingMap, **fields) -> Decision:
        """The one decision: `tying_map` from the current step, its groups started by `tie_init`, relaxed by `lora_rank`."""
        settings = self.settings
        return Decision(
            index=0,
            step=observation.step,
            map_before=observation.tying_map,
            map_after=tying_map,
            tie_init=settings.tie_init,
            lora_rank=settings.lora_rank,
            lora_init=settings.lora_init,
            **fields,
        )

    @property
    def lora_rank(self) -> int | None:
        return self.settings.lora_rank


class StaticDecisions(_OneDecision):
    """`static:<spec or entries>`: the map is applied when the trainer is built and never changes."""

    mode = "static"
    argument = "<spec or entries>"

    @classmethod
    def resolved_settings(cls, args) -> dict[str, Any]:
        values = super().resolved_settings(args)
        argument = split_strategy(args.tying_strategy)[1]
        if not argument:
            raise ValueError(f"tying_strategy={args.tying_strategy!r} needs an argument, e.g. 'static:cycle:4' or 'static:0,0,2,2'")
        try:
            check_static_spec(argument)
        except ValueError as error:
            raise ValueError(f"tying_strategy={args.tying_strategy!r}: {error}") from None
        return values

    def __init__(self, settings: StaticSettings, num_blocks: int):
        super().__init__(settings, num_blocks)
        try:
            self.tying_map = resolve_tying_map(settings.argument, num_blocks)
        except ValueError as error:
            raise ValueError(f"tying_strategy={settings.tying_strategy!r} does not fit the model: {error}") from None

    @property
    def num_distinct(self) -> int:
        """Blocks owning weights under the map (`similarity:U` has U)."""
        return self.tying_map.num_distinct

    def start(self, observation: Observation) -> Decision:
        return self._decision(observation, self.tying_map)


class SimilarityDecisions(_OneDecision):
    """`similarity:U`: the model trains under its own map for `similarity_warmup_steps` steps (every block its own
    weights from scratch or from a plain checkpoint; a tied checkpoint stays tied, as it was given), then the blocks
    are tied into U groups: block 0 and the U - 1 blocks that move their input most on the current batch (angular
    distance) keep their weights, every other block uses the nearest kept block before it
    (`hf_layertie.block_similarity`)."""

    mode = "similarity"
    argument = "U"
    Settings = SimilaritySettings
    changes_map = True

    @classmethod
    def resolved_settings(cls, args) -> dict[str, Any]:
        values = super().resolved_settings(args)
        argument = split_strategy(args.tying_strategy)[1]
        if positive_integer(argument) is None:
            raise ValueError(
                f"tying_strategy={args.tying_strategy!r}: similarity needs the number of distinct blocks, a positive "
                f"integer, as in 'similarity:4'"
            )
        check_integer("similarity_warmup_steps", values["similarity_warmup_steps"], minimum=0)
        if args.max_steps > 0:
            _check_warmup_ends(values["similarity_warmup_steps"], args.max_steps)
        return values

    def __init__(self, settings: SimilaritySettings, num_blocks: int):
        super().__init__(settings, num_blocks)
        self.num_distinct = int(settings.argument)
        if self.num_distinct > num_blocks:
            raise ValueError(f"tying_strategy={settings.tying_strategy!r} asks for more distinct blocks than the model's {num_blocks}")

    def check_run(self, max_steps: int) -> None:
        _check_warmup_ends(self.settings.similarity_warmup_steps, max_steps)

    def is_due(self, step: int, current: Decision | None) -> bool:
        return step >= self.settings.similarity_warmup_steps and current is None

    def decide(self, observation: Observation) -> Decision | None:
        if not observation.is_main_process:
            return None
        started = time.perf_counter()
        distances = observation.block_distances()
        tying_map = similarity_tying_map(distances, self.num_distinct)
        seconds = {"decision": time.perf_counter() - started}
        return self._decision(observation, tying_map, angular_distances=distances, seconds=seconds)


def _check_warmup_ends(warmup_steps: int, max_steps: int) -> None:
    """A warm-up that lasts the whole run would never tie, while the card reports the similarity strategy."""
    if warmup_steps >= max_steps:
        raise ValueError(
            f"similarity_warmup_steps={warmup_steps} is not below the run's {max_steps} optimizer steps: the blocks "
            f"would never be tied. Pass a shorter warm-up or more steps"
        )
