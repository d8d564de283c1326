"""`TyingTrainer`: transformers' Trainer with a tying strategy inside `training_step`.

The strategy (`hf_layertie.decisions`, chosen by `TyingTrainingArguments.tying_strategy`) says when a decision
is due and what it is, from what it observes (`Observation`); the trainer does the rest, in one place (`_take`). On
the first micro-batch of an optimizer step where a decision is due (so exactly once per optimizer step, whatever
the gradient accumulation), the strategy returns the `Decision` on the main process, the trainer sends it to the
other processes, every process re-ties its model and brings the optimizer (`sync_optimizer_with_model`) and the DDP
wrapper (`rebuild_data_parallel`) in line with the model's Parameters, and the decision enters the run's history
(`TyingHistory`, `tying_history.jsonl`) and `Trainer.log`.

Checkpoints carry the strategy's state (`checkpoint_format`) next to a model whose config holds that step's map;
resuming re-ties the model to the checkpoint's map before loading its weights, and is refused when the checkpoint
was saved under other tying settings (`TyingTrainingArguments.resume_settings`). The final model is saved with its
tying state too, so that a run whose last outputs were lost is finished from it without training a step more.
Checkpoints also carry the run's training totals (`TrainingTotals`), so that a resumed run reports the whole run's
training loss, runtime and speeds.

With `distill_from`, the loss is the mix of the next-token loss and the KL from a frozen teacher
(`hf_layertie.trainer.distillation`): the teacher lives beside the model, not in it, so it never reaches the
optimizer, the DDP wrapper or a checkpoint, and a resumed run loads it again.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from accelerate.utils import broadcast_object_list, gather_object
from transformers import Trainer, TrainerState
from transformers.integrations import is_tensorboard_available
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput, rotate_checkpoints

from ..block_similarity import block_angular_distances
from ..checks import perplexity
from ..decisions import Decision, Observation, TyingDecisions
from ..model_card import build_model_card, write_model_card
from ..models._compat import (
    carries_integrated_adapters,
    check_trainer_private_api,
    declared_tied_weights,
    prepare_inputs,
    remove_unused_columns,
    trainer_output_dir,
)
from ..models.adapter_export import is_adapter_layer
from ..models.tied_blocks import ParameterCounts, TiedBlocksMixin
from ..models.tying_map import TyingMap
from ..relaxed_ties import check_lora_rank, holds_adapters, load_relaxed_weights, relax_ties
from .block_learning_rates import split_by_block_uses
from .checkpoint_format import (
    TYING_STATE_NAME,
    check_checkpoint_readable,
    check_resumes_starting_model,
    check_tying_state_belongs,
    checkpoint_digest,
    checkpoint_step,
    checkpoint_tying_map,
    explain_write_errors,
    finished_training_step,
    last_complete_checkpoint,
    read_tying_state,
    starting_model,
    write_tying_state,
)
from .compilation import compile_regionally
from .distillation import Distillation
from .loop_schedule import skipped_over_training, skipped_positions_at
from .non_finite_loss import NonFiniteLossGuard
from .optimizer_sync import add_to_optimizer, rebuild_data_parallel, sync_optimizer_with_model
from .training_args import LOOP_SETTINGS, TyingTrainingArguments
from .training_totals import TrainingTotals
from .tying_history import TyingHistory
from .tying_plot import plot_tying_history, require_matplotlib

logger = logging.getLogger(__name__)
# The private Trainer methods below override or call (`_compat.TRAINER_PRIVATE_API`): a rename fails here, by name.
check_trainer_private_api(Trainer)

TYING_PLOT_NAME = "tying_map.png"
# Where the agent's wall time goes (`TyingTrainer.tying_seconds`).
OVERHEAD_PARTS = ("reward", "decision", "retie", "optimizer_sync", "ddp_rebuild", "logging")
# Row fields that are not measurements (left out of `Trainer.log`).
_ROW_LABELS = ("index", "step", "block", "source")


class TyingTrainer(Trainer):
    """A `transformers.Trainer` that learns (or fixes) which transformer blocks share weights.

    Args:
        model: a tied model (`TiedGPT2LMHeadModel`, `TiedBertForMaskedLM`, ... any `TiedBlocksMixin` model);
            any model for `tying_strategy="none"`.
        args: `TyingTrainingArguments`.
        reward_dataset: `reward_source="held_out"`: held-out examples whose first `reward_batch_size` form the
            fixed reward batch. Defaults to `eval_dataset`. Never pass the test split.
        model_card_kwargs: extra keyword arguments of `hf_layertie.model_card.build_model_card`
            (`dataset_names`, `base_model`, ...) for the card written with the final model.
        **kwargs: everything `Trainer` accepts, but `model_init` with a strategy that ties.

    Raises:
        ValueError: when built with `model_init` for a strategy that ties, or with a tied model under FSDP or
            DeepSpeed (neither follows a re-tie); from `train(resume_from_checkpoint=...)`, when the checkpoint was
            saved under other tying settings (`TyingTrainingArguments.resume_settings`) or its `tying_state.pt` cannot
            be read; from `train`, when the strategy cannot serve the run (a similarity warm-up as long as the run).
        FloatingPointError: from `train`, when a training loss or the gradient norm is NaN or infinite, before that
            step's update.

    Attributes:
        decisions: the strategy (`hf_layertie.decisions.TyingDecisions`) owning the run's tying decisions.
        tying_seconds: wall time of the tying work since this trainer was built, by part (`OVERHEAD_PARTS`);
            `sum(...)` is the agent's overhead. A resumed run's counts this sitting only (the training metrics count
            the whole run).
        distillation: with `distill_from`, the teacher and the loss (`Distillation`, also `compute_loss_func`);
            else None.
    """

    def __init__(
        self,
        model=None,
        args: TyingTrainingArguments | None = None,
        reward_dataset=None,
        model_card_kwargs: dict | None = None,
        **kwargs,
    ):
        if not isinstance(args, TyingTrainingArguments):
            raise TypeError(f"TyingTrainer needs args of type TyingTrainingArguments, got {type(args).__name__}")
        _refuse_engine(model, "FSDP", bool(args.fsdp))
        _refuse_model_init(args, kwargs.get("model_init"))
        _refuse_unread_reward_dataset(args, reward_dataset)
        _report_to_installed_tensorboard_only(args)
        super().__init__(model=model, args=args, **kwargs)
        _refuse_engine(self.model, "FSDP", self.is_fsdp_enabled)  # accelerate's plugin (`accelerate launch --use_fsdp`)
        _refuse_engine(self.model, "DeepSpeed", self.is_deepspeed_enabled)
        self.model_card_kwargs = _checked_card_kwargs(model_card_kwargs)
        self.tying_seconds = dict.fromkeys(OVERHEAD_PARTS, 0.0)
        self.history = TyingHistory(args.output_dir)
        self._non_finite_loss = NonFiniteLossGuard()
        self._run_checked = False
        self._reward_examples = None
        self._reward_batches = None
        self._best_step_loaded: int | None = None  # the best checkpoint's step, once its model is loaded at the end
        # The run's training totals: those of the checkpoint resumed from, plus the sitting in `train` (its summed
        # loss and start), if one is under way.
        self._totals = TrainingTotals()
        self._sitting_loss = 0.0
        self._sitting_start: float | None = None
        decisions_class = args.decisions_class
        if decisions_class.needs_tied_model:
            self._check_model_can_tie()
        self._draws_plot = args.tying_plot and decisions_class.needs_tied_model and _matplotlib_installed()
        if decisions_class.changes_map and args.ddp_static_graph:
            raise ValueError(f"ddp_static_graph=True cannot follow re-ties; leave it unset with tying_strategy={args.tying_strategy!r}")
        if decisions_class.changes_map and args.auto_find_batch_size:
            # On running out of memory the Trainer restarts its loop at step 0 with half the batch, while the map,
            # the decisions and their history carry on from the attempt that failed.
            raise ValueError(
                f"auto_find_batch_size=True would restart training at step 0 under the map the failed attempt left; "
                f"set per_device_train_batch_size yourself with tying_strategy={args.tying_strategy!r}"
            )
        num_blocks = len(self.model.tied_blocks) if isinstance(self.model, TiedBlocksMixin) else 0
        self.decisions: TyingDecisions = decisions_class(args, num_blocks)
        if args.lora_rank is not None:  # static and similarity: before the map is applied (similarity's after a warm-up)
            check_lora_rank(self.model, args.lora_rank, self.decisions.num_distinct)
        if args.reward_source == "held_out":
            self._reward_examples = self._select_reward_examples(reward_dataset)
        # untie_init="own": each block's weights when training started, on CPU (a resumed run takes them again from
        # the model it was given: the one its first run started from).
        self._starting_weights = self._block_weights() if args.untie_init == "own" else None
        self.distillation = self._start_distillation()
        start = self.decisions.start(self._observation())
        _refuse_moving_relaxed_ties(self.model, args.tying_strategy, decisions_class.changes_map, start)
        _refuse_loop_onset_without_loops(self.model, args.loop_onset)
        _refuse_loop_lr_without_own_optimizer(self.model, args.loop_lr_exponent, self.optimizer)
        if start is not None:
            self._take(start)

    # ----- construction -----

    def _check_model_can_tie(self) -> None:
        if isinstance(self.model, TiedBlocksMixin):
            return
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else None
        if isinstance(base, TiedBlocksMixin):
            raise ValueError(
                f"tying_strategy={self.args.tying_strategy!r} does not support PEFT-wrapped models "
                f"({type(self.model).__name__} around a {type(base).__name__}): choose the map first (train the tied "
                f"model without adapters, or load it with tying_map=...), then train the adapters on that fixed map "
                f"with tying_strategy='none'"
            )
        raise ValueError(
            f"tying_strategy={self.args.tying_strategy!r} needs a model with tied blocks (TiedGPT2LMHeadModel, "
            f"TiedBertForMaskedLM or another TiedBlocksMixin model), got {type(self.model).__name__}; "
            f"use tying_strategy='none' for conventional training"
        )

    def _start_distillation(self) -> Distillation | None:
        """With `distill_from`, load the teacher and make the mixed loss the Trainer's `compute_loss_func`, so that
        the Trainer counts the scored tokens and scales the loss as it does the model's own (the count spans the
        accumulated micro-batches and the processes: the mix averages exactly). Logs the teacher's memory once."""
        args = self.args
        if args.distill_from is None:
            return None
        if self.compute_loss_func is not None or args.label_smoothing_factor != 0:
            raise ValueError(
                "distill_from replaces the training loss: leave compute_loss_func and label_smoothing_factor unset "
                "(the next-token term of the mix is the plain cross-entropy)"
            )
        if args.n_gpu > 1:
            raise ValueError(
                f"distill_from under torch.nn.DataParallel ({args.n_gpu} GPUs in one process): the Trainer scales a loss "
                "computed once on the gathered batch as if each GPU had computed its own, so the mix would count "
                f"{args.n_gpu} times. Launch one process per GPU (accelerate launch, or torchrun)"
            )
        distillation = Distillation.load(
            args.distill_from, args.distillation_temperature, args.distillation_alpha, self.model, self.processing_class
        )
        self.compute_loss_func = distillation
        student_mib = sum(parameter.numel() * parameter.element_size() for parameter in self.model.parameters()) / 2**20
        logger.info(
            f"Distilling from {args.distill_from} (T={args.distillation_temperature}, alpha={args.distillation_alpha:.4g}): "
            f"the teacher holds {distillation.parameters_mib:,.2f} MiB of frozen parameters on {distillation.teacher.device}, outside "
            f"the student's training state (its parameters: {student_mib:,.2f} MiB, before gradients and optimizer state)"
        )
        return distillation

    def _build_accelerator_args(self, **kwargs) -> dict:
        """`Trainer`'s accelerator arguments; with `torch_compile` on a tied model, a dynamo plugin that compiles each
        block on its own (accelerate's regional compilation), so that a re-tie does not recompile (`compilation`)."""
        accelerator_args = super()._build_accelerator_args(**kwargs)
        if self.args.torch_compile and isinstance(self.model, TiedBlocksMixin):
            compile_regionally(accelerator_args.get("dynamo_plugin"), self.args.use_cache)
        return accelerator_args

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """`Trainer.compute_loss`; distilling, the teacher first scores the micro-batch. Only in training: evaluation
        (the model in eval mode) keeps the student's next-token loss."""
        if self.distillation is not None and model.training:
            self.distillation.observe(inputs)
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)

    def _select_reward_examples(self, reward_dataset):
        dataset = reward_dataset if reward_dataset is not None else self.eval_dataset
        if isinstance(dataset, dict):
            raise ValueError("reward_dataset: several eval datasets were given; pass the held-out reward data explicitly")
        if dataset is not None and not hasattr(dataset, "__len__"):
            raise ValueError(
                "reward_source='held_out' takes its fixed reward batch from a dataset with a length, and reward_dataset "
                "(or eval_dataset) is a stream: read its first reward_batch_size examples into memory first "
                "(hf_layertie.toolkit.split_reward_examples does, and skips them in the stream)"
            )
        if dataset is None or len(dataset) == 0:
            raise ValueError(
                "reward_source='held_out' needs held-out data for the reward: pass reward_dataset= (or eval_dataset=), "
                "never the test split"
            )
        count = min(self.args.reward_batch_size, len(dataset))
        if hasattr(dataset, "select"):
            return remove_unused_columns(self, dataset.select(range(count)), description="reward")
        return [dataset[index] for index in range(count)]

    # ----- decisions, inside training_step -----

    def training_step(self, model, inputs, num_items_in_batch=None):
        if not self._run_checked:
            self.decisions.check_run(self.state.max_steps)
            # Re-ties rebuild the DDP wrapper; a fixed map (relaxed or not) is applied before the Trainer wraps it.
            if self.args.decisions_class.changes_map:
                from .optimizer_sync import check_data_parallel_can_rebuild

                check_data_parallel_can_rebuild(self.model_wrapped)
            self._run_checked = True
        if self.decisions.is_due(self.state.global_step, self.history.current):
            self._synchronize()  # the strategy's timings start here, not with the queued training kernels
            decision = self._on_every_process(lambda: self.decisions.decide(self._observation(inputs)))
            with self._timed("decision"):
                decision = self._broadcast(decision)
            if decision is not None:
                self._take(decision)
        if self.args.loop_onset is not None:
            self._schedule_loops()
        # After a re-tie the DDP wrapper was rebuilt in place; `model_wrapped` is always the live one.
        loss = super().training_step(self.model_wrapped, inputs, num_items_in_batch)
        self._sitting_loss += loss  # on the device, as the Trainer sums it: no synchronisation per step
        self.decisions.observe_loss(loss)
        self._non_finite_loss.observe(loss)
        return loss

    def _schedule_loops(self) -> None:
        """This step's depth (`loop_onset`, `loop_schedule`): the positions it skips, set in the model's config, which
        its forward passes, evaluations and saves read. A function of the step and the map alone, so a resumed run
        computes what the uninterrupted one does; from the onset on, every position computes."""
        self.model.config.skipped_positions = skipped_positions_at(
            self.state.global_step, self.state.max_steps, self.model.tying_map, self.args.loop_onset, self.args.loop_schedule
        )

    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        """The Trainer's optimizer; under `loop_lr_exponent`, its groups split by block use count, each at its own
        learning rate (`split_by_block_uses`), before the learning-rate scheduler reads them."""
        built_here = self.optimizer is None
        optimizer = super().create_optimizer(model)
        if built_here and self.args.loop_lr_exponent is not None:
            split_by_block_uses(optimizer, self.model, self.args.loop_lr_exponent)
        return optimizer

    def _skipped_over_training(self) -> list[dict]:
        """The positions the run's steps skipped, as change points for the plot (`skipped_over_training`)."""
        args = self.args
        fixed = None if args.loop_onset is not None else self.model.config.skipped_positions
        return skipped_over_training(self.tying_records, self.state.global_step, self.state.max_steps, args.loop_onset, args.loop_schedule, fixed)

    def _get_grad_norm(self, model, grad_norm=None):
        """The Trainer's gradient norm, measured before `optimizer.step()`: the step's losses and this norm are
        checked there (`NonFiniteLossGuard.check`), so no update, checkpoint or model is made of NaN weights."""
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        self._non_finite_loss.check(grad_norm, self.accelerator, self.state.global_step, self.args.output_dir, self.args.learning_rate)
        return grad_norm

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, **kwargs) -> TrainOutput:
        """`Trainer.train`, then the strategy's last reward (the loss of the steps after the last decision).

        The training metrics (`train_loss`, `train_runtime`, `train_*_per_second`, `total_flos`) are the whole
        run's, over every sitting (`TrainingTotals`): resumed from a checkpoint, the mean loss of all the steps
        since the start, not of those this call trained; the Trainer's closing entry of `log_history` is given the
        same numbers. A checkpoint that already reached `max_steps`, or the last step of its `num_train_epochs`
        (or the output folder of a finished run), is not trained further: the model, the decisions and the trainer state are
        restored from it, and the run ends there with the metrics it had. `resume_from_checkpoint=True` resumes
        from the last complete checkpoint in `output_dir` (one a crash left without its tying state is skipped).
        """
        if resume_from_checkpoint is True:  # transformers would take the highest-numbered folder, complete or not
            last = last_complete_checkpoint(self.args.output_dir)
            if last is None:
                raise ValueError(f"resume_from_checkpoint=True: no complete checkpoint in {self.args.output_dir}")
            resume_from_checkpoint = str(last)
        if isinstance(resume_from_checkpoint, os.PathLike):
            resume_from_checkpoint = os.fspath(resume_from_checkpoint)
        finished = isinstance(resume_from_checkpoint, str) and finished_training_step(
            resume_from_checkpoint, self.args.max_steps, self.args.num_train_epochs
        ) is not None
        # Resuming loads the checkpoint's totals; a sitting an earlier call left unfinished (it raised) is not one.
        self._totals, self._sitting_loss, self._sitting_start = TrainingTotals(), 0.0, None
        if finished:
            metrics = self._finish_from(resume_from_checkpoint)
        else:
            self._sitting_start = time.time()
            # The Trainer's closing log entry ended the sitting (`log`): `_totals` are the run's.
            metrics = super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial, **kwargs).metrics
            self._finish_decisions()
        metrics.update(self._totals.metrics(self.state.global_step, self._samples_per_step(), self.state.total_flos))
        if self.distillation is not None:
            metrics["teacher_parameters_mib"] = self.distillation.parameters_mib
        return TrainOutput(self.state.global_step, metrics["train_loss"], metrics)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """`Trainer.log`; the closing entry of a sitting (`train_runtime`, `train_loss`, speeds), which `Trainer.train`
        computes over this sitting's steps only, carries the whole run's instead: the console, the trackers and
        `trainer_state.json` show the numbers `train` returns. Collective, as the closing entry is logged by all."""
        if "train_runtime" not in logs or self._sitting_start is None:
            super().log(logs, start_time)
            return
        # The sitting ends here (its loss summed over processes once); `train` then finds the totals closed.
        self._totals, self._sitting_start = self._training_totals(logs["train_runtime"]), None
        whole_run = {**logs, **self._totals.metrics(self.state.global_step, self._samples_per_step(), self.state.total_flos)}
        super().log(whole_run, start_time)
        # What `Trainer.log` adds (`epoch`, tokens seen) reaches the metrics `train` returns, as without the override;
        # the sitting's own numbers stay in them (`train` adds the run's from them).
        logs.update({key: value for key, value in whole_run.items() if key not in logs})

    def _finish_from(self, checkpoint: str) -> dict[str, float]:
        logger.warning(f"{checkpoint} is at max_steps={self.args.max_steps} already: finishing the run from it, training no step")
        self._load_from_checkpoint(checkpoint)
        self.state = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE_NAME))
        self._finish_decisions()
        # From the last checkpoint, as the run would have ended uninterrupted; a finished run's output folder holds
        # the best model already. A best checkpoint gone since is left, as the Trainer leaves it (with a warning).
        best = self.state.best_model_checkpoint
        if self.args.load_best_model_at_end and best is not None and Path(checkpoint).name.startswith(PREFIX_CHECKPOINT_DIR):
            if os.path.isdir(best):
                self._load_best_model()
            else:
                logger.warning(f"Could not find the best model at {best}: the run ends on {checkpoint}'s model")
        elif self.args.load_best_model_at_end and best is not None:  # the folder's model: the best, as its run ended
            self._best_step_loaded = self.state.best_global_step
        return {"epoch": self.state.epoch}

    def _training_totals(self, sitting_runtime: float | None = None) -> TrainingTotals:
        """The run's totals up to now: the checkpoint's resumed from, plus the sitting under way (collective). Its
        runtime is `sitting_runtime` when it is over (`Trainer.train`'s own measure), else the time since it began."""
        if self._sitting_start is None:
            return self._totals
        loss_sum = self._mean_over_processes(float(self._sitting_loss))
        runtime = time.time() - self._sitting_start if sitting_runtime is None else sitting_runtime
        return self._totals.plus(loss_sum, runtime)

    def _samples_per_step(self) -> int:
        """Examples per optimizer step over all processes, as `Trainer.train` counts them for its speeds."""
        return self.state.train_batch_size * self.args.gradient_accumulation_steps * self.args.world_size

    def _finish_decisions(self) -> None:
        """Give the decision still pending its outcome (the loss of the steps after it), log it and write the history."""
        if self.history.pending is not None:  # the same on every process: all join the collectives or none
            with self._timed("reward"):
                outcome = self._on_every_process(lambda: self.decisions.finish(self._observation()))
            outcome = self._broadcast(outcome)
            if outcome is not None:
                self._log_decision(self.history.complete(outcome), None)
        self.history.flush(self.args.should_save)

    def _observation(self, inputs=None) -> Observation:
        """The run as the strategy sees it now; `inputs`, the current micro-batch, for `block_distances`."""
        return Observation(
            step=self.state.global_step,
            max_steps=self.state.max_steps,
            tying_map=self.model.tying_map if isinstance(self.model, TiedBlocksMixin) else None,
            current=self.history.current,
            is_main_process=self.is_world_process_zero(),
            process_index=self.args.process_index,
            num_processes=self.accelerator.num_processes,
            held_out_loss=self.held_out_loss,
            block_distances=functools.partial(self._block_distances, inputs),
            mean_over_processes=self._mean_over_processes,
            gather=self._gather,
        )

    def _take(self, decision: Decision) -> None:
        """Apply `decision` to the model, then complete the decision it replaces, record it and log them: the one
        place a decision reaches the model and the history."""
        counts = self._apply(decision)
        decision = dataclasses.replace(decision, trainable_parameters=counts.trainable, block_parameters=counts.blocks)
        for part, seconds in decision.seconds.items():
            self.tying_seconds[part] += seconds
        if decision.index is None:  # a starting map outside the history
            return
        completed = None
        if decision.previous_outcome is not None:
            completed = self.history.complete(decision.previous_outcome)
        self.history.record(decision)
        if decision.completed:
            self._log_decision(decision, None)
        else:
            self._log_decision(completed, decision)

    @torch.no_grad()
    def held_out_loss(self) -> float:
        """Loss of the fixed reward batch in eval mode, in chunks of one training micro-batch (so it never raises
        the memory peak), averaged over the chunks by their number of examples."""
        if self._reward_batches is None:
            examples = list(self._reward_examples)
            size = self.args.per_device_train_batch_size
            # Collate once under a forked CPU RNG: masking collators draw random numbers, and the global RNG must not
            # move. Only the CPU generator is seeded (torch.manual_seed would reseed the accelerators' too, which the
            # fork does not restore: dropout on a GPU would differ between a run and its resumption).
            with torch.random.fork_rng(devices=[]):
                torch.default_generator.manual_seed(self.args.agent_seed)
                self._reward_batches = [
                    (self.data_collator(examples[start : start + size]), len(examples[start : start + size]))
                    for start in range(0, len(examples), size)
                ]
        model = self.model
        was_training = model.training
        model.eval()
        try:
            total = sum(float(model(**prepare_inputs(self, batch)).loss) * count for batch, count in self._reward_batches)
        finally:
            model.train(was_training)
        value = total / sum(count for _, count in self._reward_batches)
        if not math.isfinite(value):
            logger.warning(f"Held-out loss is {value} at step {self.state.global_step}; the agent will skip this reward")
        return value

    def _apply(self, decision: Decision) -> ParameterCounts:
        """Re-tie the model to `decision`'s map, bring the optimizer and the DDP wrapper along, and return the
        model's parameter counts.

        `tie_init` as in `retie`; with `untie_to_start`, the block an agent's decision unties takes back its weights
        from when training started, with fresh optimizer state (`untie_init="own"`); `lora_rank` relaxes the new ties
        (`relax_ties`), whose adapters join the param group of the weights they adapt."""
        lora_rank, lora_init = decision.lora_rank, decision.lora_init
        untied_weights = self._starting_weights if decision.untie_to_start else None
        weights_before = self._block_weights() if lora_init == "svd" else None
        with self._timed("retie"):
            report = self.model.retie(decision.map_after, tie_init=decision.tie_init)
            restored = [
                parameter
                for block in (_block_untied(decision, report.old_map) if untied_weights is not None else [])
                for parameter in _load_block_weights(self.model.tied_blocks[block], untied_weights[block])
            ]
        if report.changed and self.optimizer is not None:
            with self._timed("optimizer_sync"):
                sync_optimizer_with_model(self.optimizer, self.model, report)
                for parameter in restored:
                    getattr(self.optimizer, "optimizer", self.optimizer).state.pop(parameter, None)
        if lora_rank is not None:
            self._relax(lora_rank, lora_init, weights_before)
        if report.changed or lora_rank is not None:
            with self._timed("ddp_rebuild"):
                rebuild_data_parallel(self.model_wrapped)
        return self.model.parameter_counts()

    def _relax(self, lora_rank: int, lora_init: str, weights_before: dict | None) -> None:
        """Add the adapters of relaxed ties; mid-run (similarity decides at its first step), also into the optimizer,
        in the group of the weights they adapt (the caller rebuilds the DDP wrapper)."""
        adapters = relax_ties(self.model, lora_rank, lora_init, weights_before)
        if self.optimizer is not None:
            adapted = next(module for module in self.model.tied_blocks.modules() if is_adapter_layer(module))
            add_to_optimizer(self.optimizer, self.model, adapters, like=adapted.base_layer.weight)

    # ----- logging and history -----

    @property
    def tying_records(self) -> list[dict]:
        """Every decision of the run in order as log rows, the one in force included: what the map was from which step."""
        return self.history.rows

    def _log_decision(self, completed: Decision | None, current: Decision | None) -> None:
        """Log the decision whose outcome just became known and the map now in force through `Trainer.log`."""
        with self._timed("logging"):
            logs = {}
            for decision in (completed, current):
                if decision is not None:
                    logs.update(_numbers("tying", decision.to_row(), skip=_ROW_LABELS))
                    logs["tying/map"] = decision.map_after.render()
            if logs and (self.state.global_step > 0 or self.is_in_train):
                self.log(logs)

    @contextmanager
    def _timed(self, part: str):
        """Add the wall time of the block to `tying_seconds[part]`; on a GPU, after the queued kernels finish, or
        the time of asynchronous work would be charged to whatever synchronises next."""
        self._synchronize()
        started = time.perf_counter()
        try:
            yield
        finally:
            self._synchronize()
            self.tying_seconds[part] += time.perf_counter() - started

    def _synchronize(self) -> None:
        if self.args.device.type == "cuda":
            torch.cuda.synchronize()

    # ----- what the strategy observes, and collectives -----

    def _broadcast(self, message):
        """The main process's `message` on every process (collective)."""
        if self.accelerator.num_processes == 1:
            return message
        return broadcast_object_list([message], from_process=0)[0]

    def _on_every_process(self, compute):
        """`compute()`, strategy work that every process runs at the same step (collective). Should it raise on any
        process, every process raises: that one with its error, the others naming it. Otherwise the others would wait
        in the next collective, which the failed one never joins; a launcher that does not end them (a bare
        torch.distributed launch) leaves them hanging. A strategy's own collectives come before anything that can
        raise on one process alone."""
        if self.accelerator.num_processes == 1:
            return compute()
        error = None
        try:
            result = compute()
        except Exception as raised:
            error = raised
        failures = gather_object([None if error is None else f"{type(error).__name__}: {error}"])
        if error is not None:
            raise error
        failed = [(rank, failure) for rank, failure in enumerate(failures) if failure is not None]
        if failed:
            rank, failure = failed[0]
            raise RuntimeError(
                f"Process {rank} stopped at step {self.state.global_step} with {failure}; process "
                f"{self.args.process_index} stops with it (the traceback is in process {rank}'s output)"
            )
        return result

    def _mean_over_processes(self, value: float) -> float:
        """The mean of `value` over processes (collective)."""
        if self.accelerator.num_processes == 1:
            return value
        return float(self.accelerator.reduce(torch.tensor(value, device=self.args.device), "mean"))

    def _gather(self, value: float) -> list[float]:
        """`value` of every process, by rank (collective)."""
        if self.accelerator.num_processes == 1:
            return [value]
        tensor = torch.tensor([value], dtype=torch.float64, device=self.args.device)
        return self.accelerator.gather(tensor).tolist()

    @torch.no_grad()
    def _block_weights(self) -> dict[int, dict[str, torch.Tensor]]:
        """A CPU copy of the weights every block computes with now, by block and name (blocks that share weights
        share one copy)."""
        copies: dict[torch.nn.Parameter, torch.Tensor] = {}

        def copied(parameter: torch.nn.Parameter) -> torch.Tensor:
            if parameter not in copies:
                copies[parameter] = parameter.detach().to("cpu", copy=True)
            return copies[parameter]

        blocks = self.model.tied_blocks
        return {index: {name: copied(parameter) for name, parameter in block.named_parameters()} for index, block in enumerate(blocks)}

    def _block_distances(self, inputs) -> list[float]:
        """Each block's angular distance on the micro-batch `inputs` (`hf_layertie.block_similarity`)."""
        return block_angular_distances(self.model, prepare_inputs(self, dict(inputs)))

    # ----- checkpoints, resume and saving -----

    def _tying_state(self) -> dict:
        """What `tying_state.pt` holds (collective: every process calls it, see `TyingDecisions.state_dict`)."""
        return {
            "tying_strategy": self.args.tying_strategy,
            "settings": {
                **{name: getattr(self.args, name) for name in self.args.strategy_settings()},
                **self.args.distillation_settings(),
                **{name: getattr(self.args, name) for name in LOOP_SETTINGS},
            },
            "decisions": {**self.history.state_dict(), **self.decisions.state_dict(self._observation())},
            "starting_model": starting_model(self.model),
            "training": dataclasses.asdict(self._training_totals()),
        }

    def _write_tying_state(self, folder: str, **recorded) -> None:
        state = self._tying_state()
        if self.args.should_save:
            write_tying_state(folder, {**state, **recorded})

    def _save_checkpoint(self, model, trial) -> None:
        """The Trainer's checkpoint, then the tying state, written last and atomically (a checkpoint with a
        `tying_state.pt` is complete), then the history so far; only then are old checkpoints rotated out
        (`save_total_limit`), which the Trainer does at the end of its own part: a crash while this checkpoint is
        incomplete leaves the last complete one. A failed write names the folder and the disk's free space. With
        `push_to_hub`, the checkpoint is pushed once complete, which the Trainer would do before the tying state."""
        run_dir = trainer_output_dir(self, trial)
        folder = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self.args.should_save:
            # A run resumed from an earlier checkpoint saves again into a folder its first run left: that run's tying
            # state would make this one look complete while it is half written.
            Path(folder, TYING_STATE_NAME).unlink(missing_ok=True)
        with _set_aside(self.args, save_total_limit=None, push_to_hub=False) as asked, explain_write_errors(folder):
            super()._save_checkpoint(model, trial)
        self._write_tying_state(folder, checkpoint_sha256=checkpoint_digest(folder) if self.args.should_save else None)
        self.history.flush(self.args.should_save)
        if asked["push_to_hub"]:
            self._push_from_checkpoint(folder)
        if self.args.should_save:
            rotate_checkpoints(run_dir, asked["save_total_limit"], self.state.best_model_checkpoint, use_mtime=True)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        state = read_tying_state(resume_from_checkpoint)
        check_checkpoint_readable(resume_from_checkpoint)
        check_tying_state_belongs(resume_from_checkpoint, state)
        check_resumes_saved_settings(self.args, resume_from_checkpoint, state)
        check_resumes_starting_model(resume_from_checkpoint, state, self.args.untie_init, self.model)
        self._totals = TrainingTotals.saved_in(state, checkpoint_step(resume_from_checkpoint) or 0)
        if isinstance(self.model, TiedBlocksMixin) and self.args.tying_mode != "none":
            self._retie_to_checkpoint(resume_from_checkpoint)
        if state is not None:
            # The strategy's state beside the run's decisions (their keys as `TyingHistory.state_dict` writes them).
            saved = dict(state["decisions"])
            self.history.load_state_dict({"rows": saved.pop("rows"), "pending_row": saved.pop("pending_row")})
            self.decisions.load_state_dict(saved, self._observation())
            # The history on disk restarts from the checkpoint, as the run does.
            self.history.flush(self.args.should_save)
        # Relaxed ties (this run's, or those of a relaxed folder trained on as it is): a checkpoint saved after the map
        # was applied holds the tied base and its adapters; one saved before (similarity's warm-up) is a plain one,
        # and the adapters come when the run applies the map.
        relaxed = self.args.lora_rank is not None or carries_integrated_adapters(self.model)
        if relaxed and holds_adapters(resume_from_checkpoint):
            if not carries_integrated_adapters(self.model):
                self._relax(self.args.lora_rank, "zero", None)  # into an optimizer passed in, too
            load_relaxed_weights(self.model, resume_from_checkpoint)
            return
        super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_best_model(self) -> None:
        """The best checkpoint's map and weights, after the last decision got its outcome from the weights it led
        to (the Trainer loads the best model before `train` returns)."""
        self._finish_decisions()
        best = self.state.best_model_checkpoint
        # The main process's answer on every process: the re-tie below is collective.
        if not (best and self._broadcast(os.path.isdir(best))):  # the Trainer keeps the last weights, with a warning
            super()._load_best_model()
            return
        self._best_step_loaded = self.state.best_global_step
        if self.args.tying_mode != "none":
            self._retie_to_checkpoint(best)
        if carries_integrated_adapters(self.model):  # relaxed ties, this run's or a relaxed folder's trained on
            load_relaxed_weights(self.model, best)  # a best checkpoint from before the map: its adapters at zero
            return
        super()._load_best_model()

    def _retie_to_checkpoint(self, checkpoint: str) -> None:
        """Re-tie the model to `checkpoint`'s map, bringing along an optimizer that exists already (one passed in
        `optimizers`, or the Trainer's when the best model is loaded at the end) and a DDP wrapper. Collective."""
        report = self.model.retie(checkpoint_tying_map(checkpoint, len(self.model.tied_blocks)))
        if report.changed and self.optimizer is not None:
            sync_optimizer_with_model(self.optimizer, self.model, report)
        if report.changed:
            rebuild_data_parallel(self.model_wrapped)

    def _issue_warnings_after_load(self, load_result) -> None:
        # Tied blocks are not stored in the checkpoint: they are restored by sharing, not missing.
        tied = declared_tied_weights(self.model)
        load_result.missing_keys[:] = [key for key in load_result.missing_keys if key not in tied]
        super()._issue_warnings_after_load(load_result)

    def save_state(self) -> None:
        """`Trainer.save_state`, written atomically: the final `trainer_state.json` is what tells a re-run that the
        run finished, so a kill while it is written leaves the old file or none, never half of one."""
        if not self.is_world_process_zero():  # as the Trainer's own
            return
        path = os.path.join(self.args.output_dir, TRAINER_STATE_NAME)
        with explain_write_errors(self.args.output_dir):
            self.state.save_to_json(path + ".partial")
            os.replace(path + ".partial", path)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the model; a final save (not a checkpoint's) also writes its tying state, plot and model card beside
        it, and with `push_to_hub` pushes the folder once they are written (the Trainer would push before). Like
        transformers' own sharded saves, a final save is collective: call it on every process."""
        if _internal_call:  # a checkpoint's: `_save_checkpoint` explains its write errors
            super().save_model(output_dir, _internal_call)
            return
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        with _set_aside(self.args, push_to_hub=False) as asked, explain_write_errors(output_dir):
            super().save_model(output_dir, _internal_call)
        self._write_tying_state(output_dir)
        if self.args.should_save and isinstance(self.model, TiedBlocksMixin):
            with explain_write_errors(output_dir):
                self._write_plot_and_card(Path(output_dir))
        if asked["push_to_hub"]:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def create_model_card(self, model_name: str | None = None, eval_results: dict | None = None, **kwargs) -> None:
        """Write the hf-layertie card (map, distinct blocks, parameters, results, plot, loading code) as README.md.

        Called by `Trainer.push_to_hub`; `eval_results` defaults to the last evaluation in the log history. The
        Trainer card's other arguments (`license`, `tags`, `dataset`, ...) have no place in it: a warning names those
        given (datasets and base model go in `model_card_kwargs`).
        """
        if not isinstance(self.model, TiedBlocksMixin):
            return super().create_model_card(model_name=model_name, **kwargs)
        unused = sorted(name for name, value in kwargs.items() if value)
        if unused:
            logger.warning(
                f"create_model_card: the hf-layertie card does not take {', '.join(unused)}; they are left out (pass "
                f"dataset_names and base_model in TyingTrainer(model_card_kwargs=...))"
            )
        if self.is_world_process_zero():
            self._write_plot_and_card(Path(self.args.output_dir), model_name=model_name, eval_results=eval_results)

    def _write_plot_and_card(self, output_dir: Path, model_name: str | None = None, eval_results: dict | None = None):
        plot = None
        if self._draws_plot and self.tying_records:
            plot = plot_tying_history(
                self.tying_records,
                output_dir / TYING_PLOT_NAME,
                final_step=self.state.global_step,
                saved_step=self._best_step_loaded,
                skipped=self._skipped_over_training(),
            )
        evaluated_only = self.state.global_step == 0  # a run that scored the model and trained nothing
        if evaluated_only and checkpoint_step(output_dir):  # a run that trained steps: its card names the training
            logger.warning(
                f"{output_dir} holds a trained run: its model card is kept, without this evaluation's results "
                "(an output_dir of its own gets a card of the evaluation)"
            )
            return
        write_model_card(
            self.model,
            output_dir,
            training_args=None if evaluated_only else self.args,
            evaluated_only=evaluated_only,
            eval_results=eval_results if eval_results is not None else self._last_eval_metrics(),
            tying_plot=plot,
            model_name=model_name or self.args.hub_model_id or output_dir.name,
            **self.model_card_kwargs,
        )

    def _last_eval_metrics(self) -> dict:
        """The loss of the model the card describes: the last evaluation's, or, with the best model loaded at the
        end, the evaluation that chose it (the last one scored the final step's weights, which were not saved)."""
        evaluations = [entry for entry in self.state.log_history if "eval_loss" in entry]
        best = self._best_step_loaded
        if best is not None:
            evaluations = [entry for entry in evaluations if entry["step"] <= best] or evaluations
        if not evaluations:
            return {}
        loss = evaluations[-1]["eval_loss"]
        return {"eval_loss": loss, "perplexity": perplexity(loss)}


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


def _report_to_installed_tensorboard_only(args: TyingTrainingArguments) -> None:
    """Drop TensorBoard from `report_to` where it is not installed (an optional extra, which the embedded default
    run reports to), saying so, rather than let transformers' callback stop the run."""
    if "tensorboard" in args.report_to and not is_tensorboard_available():
        logger.warning("TensorBoard is not installed: not reporting to it (pip install 'hf-layertie[tensorboard]')")
        args.report_to = [name for name in args.report_to if name != "tensorboard"]


def _matplotlib_installed() -> bool:
    """Whether matplotlib (an optional extra) can draw the tying plot; without it saves draw none, as said here once."""
    try:
        require_matplotlib()
    except ImportError:
        logger.warning(f"matplotlib is not installed: {TYING_PLOT_NAME} is not drawn (pip install 'hf-layertie[plot]')")
        return False
    return True


@contextmanager
def _set_aside(args: TyingTrainingArguments, **values):
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


def _refuse_loop_onset_without_loops(model, loop_onset: float | None) -> None:
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


def _refuse_loop_lr_without_own_optimizer(model, loop_lr_exponent: float | None, optimizer) -> None:
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


def _refuse_moving_relaxed_ties(model, strategy: str, changes_map: bool, start: Decision | None) -> None:
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


def _refuse_engine(model, engine: str, enabled: bool) -> None:
    """Refuse to hand a tied model to `engine` (a key of `_ENGINES_THAT_CANNOT_FOLLOW_RETIES`), naming what works."""
    if enabled and isinstance(model, TiedBlocksMixin):
        how_enabled, why = _ENGINES_THAT_CANNOT_FOLLOW_RETIES[engine]
        raise ValueError(
            f"TyingTrainer does not train tied models under {engine} ({how_enabled}): {why}. Train on several "
            "processes with DDP (accelerate launch --multi_gpu), or shard the model yourself with "
            "hf_layertie.shard_tied_model and re-tie it with retie_sharded under torchrun (docs/multi-process.md)"
        )


def _refuse_unread_reward_dataset(args: TyingTrainingArguments, reward_dataset) -> None:
    if reward_dataset is not None and args.reward_source != "held_out":
        raise ValueError(
            f"reward_dataset is read only with reward_source='held_out', and this run's is {args.reward_source!r}: "
            f"pass reward_source='held_out' to reward decisions on it, or leave reward_dataset out"
        )


# What `write_model_card` takes that the trainer fills in itself; `model_card_kwargs` may set the rest.
_CARD_KWARGS_FILLED = frozenset({"model", "training_args", "eval_results", "tying_plot", "model_name", "evaluated_only"})


def _checked_card_kwargs(model_card_kwargs: dict | None) -> dict:
    """`model_card_kwargs`, refused at once if the card cannot take them (the card is written when training ends)."""
    model_card_kwargs = dict(model_card_kwargs or {})
    settable = [name for name in inspect.signature(build_model_card).parameters if name not in _CARD_KWARGS_FILLED]
    unknown = sorted(set(model_card_kwargs) - set(settable))
    if unknown:
        raise ValueError(f"model_card_kwargs: {', '.join(unknown)} cannot be set; the card takes {', '.join(settable)} (the trainer fills in the rest)")
    return model_card_kwargs


def _refuse_model_init(args: TyingTrainingArguments, model_init) -> None:
    """`Trainer.train` builds a fresh model with `model_init`, after the strategy applied its starting map (and
    adapters) to the model built here: the run would train a map its history does not record."""
    if model_init is not None and args.decisions_class.needs_tied_model:
        raise ValueError(
            f"TyingTrainer takes model=..., not model_init, with tying_strategy={args.tying_strategy!r}: the strategy "
            f"applies its starting map to the model when the trainer is built, and train() would replace that model "
            f"with a fresh one from model_init"
        )


def _numbers(prefix: str, row: dict, skip: tuple[str, ...]) -> dict:
    """The numeric fields of `row` as `prefix/key`, for `Trainer.log` (booleans and None left out)."""
    return {
        f"{prefix}/{key}": value
        for key, value in row.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in skip
    }


def _block_untied(decision: Decision, old_map: TyingMap) -> list[int]:
    """The block an agent's decision unties (`source == block`, tied before), or none. It is the only block whose
    weights change (`TyingMap.with_decision`): a decision that ties an owner instead leaves its followers their
    trained weights and optimizer state under a new owner, though they too become independent in the new map."""
    untie = decision.block is not None and decision.source == decision.block and not old_map.is_independent(decision.block)
    return [decision.block] if untie else []


@torch.no_grad()
def _load_block_weights(block: torch.nn.Module, weights: dict[str, torch.Tensor]) -> list[torch.nn.Parameter]:
    """Copy `weights` (by name within the block) into `block`'s Parameters; returns those Parameters."""
    parameters = dict(block.named_parameters())
    for name, value in weights.items():
        parameters[name].copy_(value)
    return [parameters[name] for name in weights]

