"""The refusals and checks of a tying run that need no running Trainer: settings that cannot work together, engines
that cannot follow re-ties, a checkpoint saved under other settings. Each runs before anything is trained (or
resumed), so a run that cannot succeed stops at once, with a message naming what works instead."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path

from transformers.integrations import is_tensorboard_available
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..decisions import Decision
from ..models._compat import carries_integrated_adapters
from ..models.tied_blocks import TiedBlocksMixin
from .checkpoint_format import TYING_STATE_NAME
from .training_args import TyingTrainingArguments

logger = logging.getLogger(__name__)


def check_resumes_saved_settings(args: TyingTrainingArguments, checkpoint: str, state: dict | None) -> None:
    """Refuse to continue `checkpoint` (a `checkpoint-N`, or the output folder of a finished run) when it was saved
    under other tying settings (`TyingTrainingArguments.resume_settings`; `state` is its tying state, None when it
    has none): the run would continue the saved map and agent, or report the finished run's results, while its card
    and its command name this run's settings."""
    wanted = args.resume_settings()
    start_afresh = (
        f"To continue that run, repeat its settings; to start a new one, train into a new output_dir, or delete "
        f"{_saved_run(checkpoint)}"
    )
    if state is None:
        if args.tying_mode == "none":
            return
        raise ValueError(
            f"cannot resume tying_strategy={args.tying_strategy!r} from {checkpoint}: it has no "
            f"{TYING_STATE_NAME}, so a plain Trainer saved it or its save was interrupted. {start_afresh}, or "
            f"resume from an earlier, complete checkpoint"
        )
    saved = {"tying_strategy": state["tying_strategy"], **state["settings"]}  # every setting (`migrate_tying_state`)
    # Under another strategy the other settings are moot: name the strategy alone.
    names = ["tying_strategy"] if saved["tying_strategy"] != wanted["tying_strategy"] else list(wanted)
    differing = [f"{name}={saved.get(name)!r} there, {wanted[name]!r} here" for name in names if saved.get(name) != wanted[name]]
    if differing:
        raise ValueError(
            f"cannot resume from {checkpoint}: it was saved under other tying settings than this run's "
            f"({'; '.join(differing)}). {start_afresh}"
        )


def _saved_run(checkpoint: str) -> str:
    """What to delete to train afresh where `checkpoint` is: the checkpoints beside it, or a finished run's folder."""
    path = Path(checkpoint).resolve()
    if path.name.startswith(f"{PREFIX_CHECKPOINT_DIR}-"):
        return f"the {PREFIX_CHECKPOINT_DIR}-* folders of {path.parent} (and pass no resume_from_checkpoint)"
    return str(path)


def report_to_installed_tensorboard_only(args: TyingTrainingArguments) -> None:
    """Drop TensorBoard from `report_to` where it is not installed (an optional extra, which the embedded default
    run reports to), saying so, rather than let transformers' callback stop the run."""
    if "tensorboard" in args.report_to and not is_tensorboard_available():
        logger.warning("TensorBoard is not installed: not reporting to it (pip install 'hf-layertie[tensorboard]')")
        args.report_to = [name for name in args.report_to if name != "tensorboard"]


@contextmanager
def set_aside(args: TyingTrainingArguments, **values):
    """Give `args` fields `values` for the Trainer's part of a save, yielding the user's, restored after: the Trainer
    would push and rotate checkpoints out before the tying state is written, so this trainer does both after it."""
    asked = {name: getattr(args, name) for name in values}
    for name, value in values.items():
        setattr(args, name, value)
    try:
        yield asked
    finally:
        for name, value in asked.items():
            setattr(args, name, value)


# Engines the Trainer can hand a model to that cannot train a tied one, with why: each is refused by name.
_ENGINES_THAT_CANNOT_FOLLOW_RETIES = {
    "FSDP": (
        "fsdp / accelerate's FSDP plugin",
        # A shared Parameter must live in one FSDP group, and no FSDP engine follows a change of what is shared.
        "FSDP would wrap tied blocks in separate groups and cannot follow re-ties",
    ),
    "DeepSpeed": (
        "deepspeed / accelerate's DeepSpeed plugin",
        # The engine flattens the Parameters it was given and hooks their gradients, so those a re-tie adds would
        # never be updated; the Trainer resumes DeepSpeed runs without `_load_from_checkpoint` (map and strategy).
        "its engine cannot follow re-ties, and its resume skips the tying state",
    ),
}


def refuse_loop_onset_without_loops(model, loop_onset: float | None) -> None:
    """`loop_onset` sets the model's `config.skipped_positions` at every step: it needs a tied model, and one whose
    config skips no position of its own (the schedule would replace the user's choice)."""
    if loop_onset is None:
        return
    if not isinstance(model, TiedBlocksMixin):
        raise ValueError(f"loop_onset={loop_onset} schedules the positions of a tied model; got a {type(model).__name__}")
    if model.config.skipped_positions is not None:
        raise ValueError(
            f"loop_onset={loop_onset} chooses the positions each step skips, and the model's config skips "
            f"{model.config.skipped_positions} already: set model.config.skipped_positions = None first, or leave "
            f"loop_onset unset"
        )


def refuse_loop_lr_without_own_optimizer(model, loop_lr_exponent: float | None, optimizer) -> None:
    """`loop_lr_exponent` splits the param groups of the optimizer the Trainer builds, before its scheduler: a tied
    model, and no optimizer passed in (its scheduler, if any, was built on the groups as they were)."""
    if loop_lr_exponent is None:
        return
    if not isinstance(model, TiedBlocksMixin):
        raise ValueError(f"loop_lr_exponent={loop_lr_exponent} sets the learning rate of a tied model's blocks; got a {type(model).__name__}")
    if optimizer is not None:
        raise ValueError(
            f"loop_lr_exponent={loop_lr_exponent} splits the param groups of the optimizer the Trainer builds, and "
            f"optimizers=(...) passed one: leave optimizers unset, or give your optimizer the groups yourself and "
            f"leave loop_lr_exponent unset"
        )


def refuse_moving_relaxed_ties(model, strategy: str, changes_map: bool, start: Decision | None) -> None:
    """Refuse a strategy that would change the map of a model carrying relaxed ties' adapters (a relaxed folder
    trained on): each adapter was fitted to the weights its position shares under that map, and would stay on weights
    it was not fitted to (logits move at learning rate 0). Before anything is trained: the check needs only the
    strategy's starting decision."""
    if not isinstance(model, TiedBlocksMixin) or not (carries_integrated_adapters(model) or model.adapted_blocks()):
        return
    if changes_map or (start is not None and start.map_after != model.tying_map):
        raise ValueError(
            f"tying_strategy={strategy!r} would change the map of a model that carries relaxed ties' adapters (a "
            f"relaxed folder, map {model.tying_map.render()}): they were fitted to the weights each position shares "
            f"under that map. Train it as it is (tying_strategy='none', or static with its own map), or tie its plain "
            f"export (to_untied()) under the new map and relax it again with lora_rank"
        )


def refuse_engine(model, engine: str, enabled: bool) -> None:
    """Refuse to hand a tied model to `engine` (a key of `_ENGINES_THAT_CANNOT_FOLLOW_RETIES`), naming what works."""
    if enabled and isinstance(model, TiedBlocksMixin):
        how_enabled, why = _ENGINES_THAT_CANNOT_FOLLOW_RETIES[engine]
        raise ValueError(
            f"TyingTrainer does not train tied models under {engine} ({how_enabled}): {why}. Train on several "
            "processes with DDP (accelerate launch --multi_gpu), or shard the model yourself with "
            "hf_layertie.shard_tied_model and re-tie it with retie_sharded under torchrun (docs/multi-process.md)"
        )


def refuse_unread_reward_dataset(args: TyingTrainingArguments, reward_dataset) -> None:
    if reward_dataset is not None and args.reward_source != "held_out":
        raise ValueError(
            f"reward_dataset is read only with reward_source='held_out', and this run's is {args.reward_source!r}: "
            f"pass reward_source='held_out' to reward decisions on it, or leave reward_dataset out"
        )


def refuse_model_init(args: TyingTrainingArguments, model_init) -> None:
    """`Trainer.train` builds a fresh model with `model_init`, after the strategy applied its starting map (and
    adapters) to the model built here: the run would train a map its history does not record."""
    if model_init is not None and args.decisions_class.needs_tied_model:
        raise ValueError(
            f"TyingTrainer takes model=..., not model_init, with tying_strategy={args.tying_strategy!r}: the strategy "
            f"applies its starting map to the model when the trainer is built, and train() would replace that model "
            f"with a fresh one from model_init"
        )


def check_model_can_tie(model, tying_strategy: str) -> None:
    """Refuse a model the strategy cannot tie (`decisions_class.needs_tied_model`), naming what works instead."""
    if isinstance(model, TiedBlocksMixin):
        return
    base = model.get_base_model() if hasattr(model, "get_base_model") else None
    if isinstance(base, TiedBlocksMixin):
        raise ValueError(
            f"tying_strategy={tying_strategy!r} does not support PEFT-wrapped models "
            f"({type(model).__name__} around a {type(base).__name__}): choose the map first (train the tied "
            f"model without adapters, or load it with tying_map=...), then train the adapters on that fixed map "
            f"with tying_strategy='none'"
        )
    raise ValueError(
        f"tying_strategy={tying_strategy!r} needs a model with tied blocks (TiedGPT2LMHeadModel, "
        f"TiedBertForMaskedLM or another TiedBlocksMixin model), got {type(model).__name__}; "
        f"use tying_strategy='none' for conventional training"
    )


def refuse_trainer_settings_that_cannot_follow_reties(args: TyingTrainingArguments) -> None:
    """Refuse the Trainer settings a strategy that changes the map mid-run (`decisions_class.changes_map`) breaks."""
    if not args.decisions_class.changes_map:
        return
    if args.ddp_static_graph:
        raise ValueError(f"ddp_static_graph=True cannot follow re-ties; leave it unset with tying_strategy={args.tying_strategy!r}")
    if args.auto_find_batch_size:
        # On running out of memory the Trainer restarts its loop at step 0 with half the batch, while the map,
        # the decisions and their history carry on from the attempt that failed.
        raise ValueError(
            f"auto_find_batch_size=True would restart training at step 0 under the map the failed attempt left; "
            f"set per_device_train_batch_size yourself with tying_strategy={args.tying_strategy!r}"
        )
