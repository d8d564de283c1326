"""`TyingTrainingArguments`: the tying method's command-line settings, next to the Trainer that reads them.

One name per setting everywhere: the agent's settings are `hf_layertie.dlt.AgentConfig`'s fields and the
reward's `hf_layertie.dlt.TyingReward`'s, under the same names; those classes own their validation. Which
settings a strategy reads, and their defaults, belong to the strategy (`hf_layertie.decisions`): every tying
setting here defaults to `None`, a setting the chosen strategy does not read must stay `None` (it is refused,
not ignored; `settings_unread_by` names them), and the strategy's defaults are filled in after construction.
The distillation settings (`DISTILLATION_SETTINGS`) belong to no strategy: they are read by the trainer whatever the
strategy, and follow the same rule around `distill_from` (unset: the other two must stay unset).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from dataclasses import dataclass, field
from types import MappingProxyType

from transformers import TrainingArguments

from ..decisions import DECISIONS, TyingDecisions, split_strategy
from ..decisions.agent import REWARD_SOURCES, UNTIE_INITS
from ..dlt.agent_config import AgentSettings
from ..dlt.reward import REWARD_KINDS
from ..engine.block_learning_rates import check_loop_lr_exponent
from ..models.configuration_tying import TIE_INITS
from ..relaxed_ties import LORA_INITS
from .loop_schedule import LOOP_SCHEDULES, check_loop_settings

# Knowledge distillation: read by `TyingTrainer` under every strategy (`hf_layertie.trainer.distillation`).
DISTILLATION_SETTINGS = ("distill_from", "distillation_temperature", "distillation_alpha")
# Their defaults with `distill_from`, DistilBERT's (Sanh et al., 2019; transformers' research_projects/distillation:
# `--temperature 2.0 --alpha_ce 5.0 --alpha_mlm 2.0`): T = 2 and the KL's weight 5.0 over the KL's and the language
# modeling loss's together, 5.0 + 2.0 (its cosine term on hidden states has no counterpart here).
DISTILLATION_DEFAULTS = {"distillation_temperature": 2.0, "distillation_alpha": 5.0 / 7.0}
# The depth schedule of looped models (`hf_layertie.trainer.loop_schedule`): read by `TyingTrainer` under every
# strategy, as the distillation settings are.
LOOP_SETTINGS = ("loop_onset", "loop_schedule", "loop_lr_exponent")


def _setting(help_text: str, choices: tuple[str, ...] | None = None) -> dataclasses.Field:
    """A strategy setting: unset by default; `_with_strategy_help` completes its help from the registry. `choices`
    (an enumerated setting's values, from the module that checks them) reach argparse, which validates the flag and
    lists them in `--help`."""
    return field(default=None, metadata={"help": help_text, **({"choices": choices} if choices else {})})


def _with_strategy_help(cls):
    """Begin each strategy setting's help with the strategies that read it and end it with their default, both from
    `DECISIONS` (each strategy's `settings`), so that neither is written a second time here. The fields are copied
    first: the agent's are `AgentSettings`' own."""
    for name in cls.strategy_settings():
        item = cls.__dataclass_fields__[name] = copy.copy(cls.__dataclass_fields__[name])
        readers, default = setting_readers(name)
        item.metadata = MappingProxyType({**item.metadata, "help": strategy_help(item.metadata["help"], readers, default)})
    return cls


def strategy_help(description: str, readers: list[str], default: str | None) -> str:
    """A strategy setting's help: its readers, what it does, and the default they give it (argparse adds the flag's
    own default after it)."""
    return f"{'/'.join(readers)}: {description}" + (f" ({default} when unset)" if default is not None else "")


def setting_readers(name: str) -> tuple[list[str], str | None]:
    """The strategies that read tying setting `name` (`DECISIONS`' `settings`), and the default they give it (its
    repr; None where they give none, or differ)."""
    readers = [mode for mode, decisions in DECISIONS.items() if name in decisions.setting_defaults()]
    defaults = {repr(DECISIONS[mode].setting_defaults()[name]) for mode in readers} - {"None"}
    return readers, (defaults.pop() if len(defaults) == 1 else None)


@_with_strategy_help
@dataclass
class TyingTrainingArguments(AgentSettings, TrainingArguments):
    r"""
    [`TrainingArguments`] plus the tying method (see `hf_layertie.decisions` for the strategies, `hf_layertie.dlt`
    for the agent and docs/training.md for every choice). Every setting but `tying_strategy`, `tying_plot` and the
    distillation settings (read under every strategy) is read by some strategies only; the others must leave it
    unset, and the defaults below apply to those that read it.

    tying_strategy (`str`, defaults to `"dlt"`):
        `dlt`: a learning agent decides the map (the method). `random`: the same schedule, options and cap with
        uniformly random actions (ablation). `static:<spec>`: a fixed map, from a strategy (`static:all`,
        `static:cycle:4`, `static:sequence:3`, ...) or explicit entries (`static:0,0,2,2`). `similarity:U`: after
        `similarity_warmup_steps` steps under the model's own map (every block independent from scratch), tie
        blocks by their functional similarity to U distinct blocks (`hf_layertie.block_similarity`). `none`: conventional training, no tying code runs.
    dlt_variant (`str`, dlt and random, defaults to `"default"`):
        The agent of `dlt`: `"default"` (this library's agent) or `"paper"` (Hay & Wolf's algorithm as the authors'
        code runs it; see `hf_layertie.dlt.agent_config`). `random` draws from the distinct options either way; there
        the variant only picks the default `reward_kind` of the rewards it logs.
    tying_initial_map (`str`, dlt and random):
        The map training starts from: a strategy spec or entries. Defaults to every block tied to block 0, as in
        the paper: the memory saving comes from that start.
    tying_interval (`int`, dlt and random, defaults to the paper's k):
        k, optimizer steps between two decisions. A decision's reward is the loss of the k steps after it.
    max_distinct_blocks (`int`, dlt and random):
        Hard cap on blocks that own weights at every step (so on training memory): options beyond it are never
        offered. `similarity:U` and `static:<spec>` fix their number of distinct blocks themselves.
    q_gamma, epsilon_start, epsilon_min, epsilon_decay, exploration_fraction, q_forgetting, q_ridge, q_hidden_size,
    q_learning_rate, q_weight_decay (dlt only):
        The agent's settings (`AgentConfig`); unset takes the variant's value, and one the variant does not use is refused.
    reward_source (`str`, dlt and random, defaults to `"train"`):
        The loss a decision is rewarded with: `"train"`, the mean training loss of the k steps after it (free: each
        batch is scored before the model trains on it), or `"held_out"`, the loss of a fixed held-out batch after
        them (costs a forward pass of `reward_batch_size` examples per decision, in micro-batch-sized chunks).
    reward_kind (`str`, dlt and random):
        What a decision's reward is made of (`TyingReward.reward_kind`): `"negative_loss"` or
        `"clipped_negative_perplexity"`. Defaults to the variant's own (the paper's agent: the clipped perplexity).
    commit_after_exploration (`bool`, dlt with the default agent, defaults to `False`):
        Stop deciding once exploration ends (`exploration_fraction` of the planned decisions) and train the map in
        force to the end: explore, then commit (the control for what moving between maps costs). Epsilon is still
        above 0 at the last decisions before it, so the committed map may keep an exploratory move.
    reward_block_cost (`float`, dlt and random, defaults to 0.0):
        Nats of loss one more block owning weights is worth to you (`TyingReward.reward_block_cost`).
    reward_batch_size (`int`, with `reward_source="held_out"` only, defaults to 16):
        Examples of the reward dataset (its first ones, fixed for the run) scored per decision.
    agent_seed (`int`, dlt and random):
        Seed of the agent's own generator; defaults to `seed` (`AgentConfig` alone defaults to 0).
    similarity_warmup_steps (`int`, similarity only, defaults to 0):
        Steps trained with every block independent before the blocks are compared (0 measures the model as loaded,
        e.g. a converted pretrained checkpoint; a model trained from scratch needs a warm-up). Must be below the
        run's number of steps.
    tie_init (`str`, static, similarity, dlt and random, defaults to `"root"`):
        How each group of the strategy's first map (`static:<spec>`'s map, `similarity:U`'s, `tying_initial_map`)
        starts from the weights the model has then: `"root"`, those its first block used; `"mean"`, the average
        of those its blocks used. Converting a trained model, use `"mean"`: never worse than `"root"` in the
        measured comparisons (bench/README.md, "Compressing a trained model (compress)"); from scratch, `"root"` keeps the initial
        weights' scale. Later decisions always share the weights of the block they tie to, as in the paper.
    lora_rank (`int`, static and similarity):
        Relaxed ties: once the strategy's map is applied, every block position gets a LoRA of this rank on each of
        its linear layers (PEFT), trained together with the shared weights, so positions that share weights can
        differ (Relaxed Recursive Transformers; `hf_layertie.relaxed_ties`). Its parameters count in the model's
        parameters and training state; the model saves as a tied checkpoint with the adapters embedded, and
        `to_untied()` merges each position's into its own weights. Unset: no adapters. Needs `peft`.
    lora_init (`str`, with `lora_rank`, defaults to `"svd"`):
        `"svd"`: each position's LoRA starts from the truncated SVD of its weights before the map minus the shared
        weights it computes with after (what the tie took from it; converting a trained model); `"zero"`: PEFT's
        initialisation, a zero update.
    untie_init (`str`, dlt and random, defaults to `"source"`):
        The weights a block starts from when a decision unties it: `"source"`, a copy of those it shared (and
        their optimizer state), as in the paper; `"own"`, the weights the block had when training started (before
        the first map was applied), kept on CPU outside the training state, with fresh optimizer state: a
        converted trained model gives an untied block back its own trained weights.
    tying_plot (`bool`, defaults to `True`):
        Write `tying_map.png` (blocks x steps, one colour per source block) next to saved models, where matplotlib
        (the `plot` extra) is installed; without it the run says so once and draws none.
    distill_from (`str`, every strategy):
        Knowledge distillation (Hinton et al., 2015): the folder or Hub id of a causal language model (tied or
        plain) whose next-token distributions the student learns besides the labels. Training then minimises
        `(1 - alpha) * CE + alpha * T^2 * KL(teacher_T || student_T)` over the tokens the next-token loss scores
        (`hf_layertie.trainer.distillation`); the logged training loss is that mix, `eval_loss` stays the next-token
        loss. The teacher runs in eval mode without gradients, on the student's device and dtype, outside the
        student's training state (never optimized, checkpointed or counted in its parameters; its memory is
        reported as `teacher_parameters_mib`). A teacher whose vocabulary or tokenizer differs from the student's is
        refused, and so is a masked language model student. Unset: no distillation. Converting a trained model, the
        teacher is that model: Relaxed Recursive Transformers (Bae et al., 2024) uptrain their converted models with
        distillation from the full-size one, Minitron (Sreenivas et al., 2024) its depth-pruned ones.
    distillation_temperature (`float`, with `distill_from`, defaults to 2.0):
        T, dividing both models' logits before the softmax; the KL term is multiplied by T^2 so that its gradients
        keep their scale (Hinton et al., 2015). 2.0 is DistilBERT's (Sanh et al., 2019).
    distillation_alpha (`float` in [0, 1], with `distill_from`, defaults to 5/7):
        The KL term's weight; the next-token loss gets `1 - alpha`. DistilBERT weighs its KL 5.0 against its
        masked language modeling loss's 2.0 (5/7 of the two); Minitron (Sreenivas et al., 2024) retrains pruned
        models on the KL alone (alpha 1, T 1).

    loop_onset (`float` in (0, 1), every strategy):
        Looped models' late onset: until this fraction of `max_steps`, the repeated positions (those whose block's
        weights an earlier position used already: positions 2 and 3 of `0 1 1 1`) are skipped
        (`config.skipped_positions`, the identity), then every position computes (`hf_layertie.trainer.loop_schedule`;
        parameter-golf's looped records switch their loops on at about 35% of the steps). Unset: every position
        computes from the start.
    loop_schedule (`str`, with `loop_onset`, defaults to `"onset"`):
        `"onset"`: every repeated position switches on at the onset; `"progressive"`: one pass first, then a pass
        more at each of equal stages before the onset (one pass, then two, ...).
    A run resumed from a checkpoint must repeat the settings of the run that saved it (`resume_settings()`);
    `TyingTrainer` refuses it otherwise, naming each setting that differs.
    """

    tying_strategy: str = field(
        default="dlt", metadata={"help": " | ".join(decisions.form() for decisions in DECISIONS.values())}
    )
    tying_initial_map: str | None = _setting("start map, a spec ('all') or entries ('0 0 2 2'). Default: all tied.")
    tying_interval: int | None = _setting("k, optimizer steps between two tying decisions.")
    reward_source: str | None = _setting("'train' (free) or 'held_out' (a fixed batch).", REWARD_SOURCES)
    reward_kind: str | None = _setting("'negative_loss' or 'clipped_negative_perplexity' (default: the variant's).", REWARD_KINDS)
    commit_after_exploration: bool | None = _setting("default agent: stop deciding once exploration ends.")
    reward_block_cost: float | None = _setting("reward cost in nats per block owning weights.")
    reward_batch_size: int | None = _setting("with reward_source='held_out': examples scored (default: 16).")
    similarity_warmup_steps: int | None = _setting("independent steps before the blocks are compared.")
    tie_init: str | None = _setting(
        "groups of the first map start from their first block's weights ('root') or their blocks' mean ('mean': "
        "converting a trained model).",
        TIE_INITS,
    )
    lora_rank: int | None = _setting("relaxed ties, a LoRA of this rank per block position on the shared weights.")
    lora_init: str | None = _setting("with lora_rank: 'svd' (the default: what the tie took from each position) or 'zero'.", LORA_INITS)
    untie_init: str | None = _setting(
        "an untied block starts from a copy of its source ('source') or from its own weights at the start of "
        "training ('own': a converted trained model).",
        UNTIE_INITS,
    )
    tying_plot: bool = field(default=True, metadata={"help": "Write tying_map.png next to saved models."})
    distill_from: str | None = field(
        default=None,
        metadata={
            "help": "knowledge distillation: folder or Hub id of a causal teacher (tied or plain) with the student's "
            "vocabulary and tokenizer; the loss becomes (1 - alpha) * CE + alpha * T^2 * KL(teacher || student) at "
            "temperature T (Hinton et al., 2015). Unset: no distillation."
        },
    )
    distillation_temperature: float | None = field(
        default=None,
        metadata={
            "help": "with distill_from: T, the softmax temperature of both models' logits (default: 2.0, DistilBERT's, "
            "Sanh et al., 2019)."
        },
    )
    distillation_alpha: float | None = field(
        default=None,
        metadata={
            "help": "with distill_from: weight of the KL term in [0, 1], the next-token loss gets 1 - alpha (default: "
            "5/7, DistilBERT's KL weight 5.0 over its 5.0 + 2.0 with the MLM loss; Minitron uses the KL alone, 1.0)."
        },
    )

    loop_onset: float | None = field(
        default=None,
        metadata={
            "help": "looped models: skip the repeated positions (a block's second and later uses) until this fraction "
            "of max_steps, then compute them (parameter-golf's late onset, about 0.35). Unset: all from the start."
        },
    )
    loop_schedule: str | None = field(
        default=None,
        metadata={
            "help": "with loop_onset: 'onset' (the default: all loops at once) or 'progressive' (one pass, then two, ...).",
            "choices": LOOP_SCHEDULES,
        },
    )
    loop_lr_exponent: float | None = field(
        default=None,
        metadata={
            "help": "looped models: a block used at N positions trains at learning_rate * N ** -loop_lr_exponent (1: "
            "lr / N, arXiv 2606.18524's per-block rate). Unset: one learning rate for all."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        self._given_for_training = self._settings_set_here()
        self._resolve_tying_settings()
        self._resolve_distillation_settings()
        if self.loop_onset is not None and self.loop_schedule is None:
            self.loop_schedule = "onset"
        check_loop_settings(self.loop_onset, self.loop_schedule)
        check_loop_lr_exponent(self.loop_lr_exponent)

    @classmethod
    def tying_fields(cls) -> list[str]:
        """The names this class adds to `TrainingArguments` (what a model card lists as the tying set-up)."""
        own = {item.name for item in dataclasses.fields(TrainingArguments)}
        return [item.name for item in dataclasses.fields(cls) if item.name not in own]

    @classmethod
    def strategy_settings(cls) -> list[str]:
        """The tying settings some strategy reads (every tying field but `tying_strategy`, `tying_plot` and the
        distillation settings, which the trainer reads under every strategy)."""
        return [
            name for name in cls.tying_fields() if name not in ("tying_strategy", "tying_plot", *DISTILLATION_SETTINGS, *LOOP_SETTINGS)
        ]

    @classmethod
    def settings_unread_by(cls, tying_strategy: str) -> list[str]:
        """The strategy settings that `tying_strategy` does not read (none for an unknown strategy, refused on its
        own). The scripts' embedded default drops those it sets: they are refused only when the user sets them."""
        decisions = DECISIONS.get(split_strategy(tying_strategy)[0])
        if decisions is None:
            return []
        return [name for name in cls.strategy_settings() if name not in decisions.setting_defaults()]

    @property
    def tying_mode(self) -> str:
        """`dlt`, `random`, `static`, `similarity` or `none`."""
        return split_strategy(self.tying_strategy)[0]

    @property
    def decisions_class(self) -> type[TyingDecisions]:
        """The strategy class (`hf_layertie.decisions`) that owns this run's tying decisions."""
        return DECISIONS[self.tying_mode]

    def tying_decisions(self, num_blocks: int) -> TyingDecisions:
        """The strategy for a model of `num_blocks` blocks, given its settings alone (`TyingDecisions.settings_from`)."""
        return self.decisions_class(self.decisions_class.settings_from(self), num_blocks)

    def resume_settings(self) -> dict[str, object]:
        """The settings a run resumed from a checkpoint must share with the run that saved it, by name: the strategy
        and every setting it reads. A resumed run continues the saved map and agent, so another strategy, schedule,
        cap, agent or reward would silently not be the one that ran (and the model card reports them)."""
        names = ["tying_strategy", *self.decisions_class.setting_defaults(), *LOOP_SETTINGS]
        return {**{name: getattr(self, name) for name in names}, **self.distillation_settings()}

    def saved_settings(self) -> dict[str, object]:
        """Every tying setting by name but `tying_strategy` and `tying_plot`, as a checkpoint's tying state records
        them (a resumed run compares those its strategy reads: `resume_settings`)."""
        return {
            **{name: getattr(self, name) for name in self.strategy_settings()},
            **self.distillation_settings(),
            **{name: getattr(self, name) for name in LOOP_SETTINGS},
        }

    def distillation_settings(self) -> dict[str, object]:
        """The distillation settings by name, as a checkpoint records and a resumed run compares them: a teacher
        folder by its absolute path, so that the same folder named from elsewhere is the same teacher. A resumed run
        reloads the teacher from there; another teacher, temperature or weight would train another loss."""
        settings = {name: getattr(self, name) for name in DISTILLATION_SETTINGS}
        if self.distill_from is not None and os.path.isdir(self.distill_from):
            settings["distill_from"] = os.path.realpath(self.distill_from)
        return settings

    def training_settings_given(self) -> list[str]:
        """The tying and distillation settings these arguments were given (not those a strategy filled in), and
        `tying_strategy` where it is neither the default nor `none`: what only training reads. An evaluation-only run scores the
        model's saved map and loads no teacher, so the scripts refuse them there rather than drop them."""
        return list(self._given_for_training)

    def _settings_set_here(self) -> list[str]:
        default_strategy = type(self).__dataclass_fields__["tying_strategy"].default
        # `none` is what evaluation runs with anyway (`without_tying`).
        changed = ["tying_strategy"] if self.tying_strategy not in (default_strategy, "none") else []
        given = (*self.strategy_settings(), *DISTILLATION_SETTINGS, *LOOP_SETTINGS)
        return changed + [name for name in given if getattr(self, name) is not None]

    def without_tying(self) -> TyingTrainingArguments:
        """These arguments with `tying_strategy="none"` and every strategy and distillation setting unset
        (evaluation only: nothing trains, so no teacher is loaded)."""
        unset = dict.fromkeys([*self.strategy_settings(), *DISTILLATION_SETTINGS, *LOOP_SETTINGS])
        return dataclasses.replace(self, tying_strategy="none", **unset)

    def _resolve_tying_settings(self) -> None:
        """Refuse settings the strategy does not read, then take the values the strategy resolves for those it reads."""
        if not isinstance(self.tying_strategy, str):
            raise ValueError(f"tying_strategy must be a string, got {self.tying_strategy!r}")
        if self.tying_mode not in DECISIONS:
            forms = [repr(decisions.form()) for decisions in DECISIONS.values()]
            raise ValueError(f"tying_strategy={self.tying_strategy!r}: expected {', '.join(forms[:-1])} or {forms[-1]}")
        if split_strategy(self.tying_strategy)[1] and self.decisions_class.argument is None:
            taking = [repr(mode) for mode, decisions in DECISIONS.items() if decisions.argument is not None]
            raise ValueError(f"tying_strategy={self.tying_strategy!r}: only {' and '.join(taking)} take a ':' argument")
        decisions = self.decisions_class
        ignored = [name for name in self.settings_unread_by(self.tying_strategy) if getattr(self, name) is not None]
        if ignored:
            read = decisions.setting_defaults()
            reads = f"it reads {', '.join(read)}" if read else "it reads no other tying setting"
            raise ValueError(
                f"tying_strategy={self.tying_strategy!r} does not read {', '.join(ignored)}: leave "
                f"{'it' if len(ignored) == 1 else 'them'} unset ({reads})"
            )
        for name, value in decisions.resolved_settings(self).items():
            setattr(self, name, value)

    def _resolve_distillation_settings(self) -> None:
        """Without `distill_from`, refuse a temperature or weight (they would be ignored); with it, fill in their
        defaults (`DISTILLATION_DEFAULTS`) and check their ranges."""
        if self.distill_from is None:
            given = [name for name in DISTILLATION_DEFAULTS if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{', '.join(given)} only apply with distill_from: set distill_from or leave them unset")
            return
        if not isinstance(self.distill_from, str) or not self.distill_from:
            raise ValueError(f"distill_from must be a teacher's folder or Hub id, got {self.distill_from!r}")
        for name, default in DISTILLATION_DEFAULTS.items():
            if getattr(self, name) is None:
                setattr(self, name, default)
        temperature, alpha = self.distillation_temperature, self.distillation_alpha
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < math.inf:
            raise ValueError(f"distillation_temperature must be a positive number, got {temperature!r}")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
            raise ValueError(f"distillation_alpha must be in [0, 1], got {alpha!r}")
