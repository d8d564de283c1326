"""`TyingTrainer`: transformers' Trainer with Dynamic Layer Tying inside `training_step`.

Every `tying_interval` optimizer steps, on the first micro-batch of that step (so exactly once per
optimizer step, whatever the gradient accumulation), the trainer:

1. measures the held-out loss of the fixed reward batch: with the loss measured at the previous
   decision, it gives that decision's reward `k` steps after it, and the agent learns from it;
2. asks the agent for the next decision (rank 0 only) and broadcasts the resulting map to every rank;
3. re-ties the model on every rank, then brings the optimizer (`sync_optimizer_with_model`) and the
   DDP wrapper (`rebuild_data_parallel`) in line with the model's Parameters;
4. logs the decision through `Trainer.log` and appends it to `tying_history.jsonl`.

Static strategies apply their map once, at construction; `none` runs the plain Trainer.
Checkpoints carry the agent (`tying_state.pt`) next to a model whose config holds that step's map;
`resume_from_checkpoint` re-ties the model to the checkpoint's map before loading its weights.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

import torch
from accelerate.utils import broadcast_object_list
from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..dlt import AgentConfig, TyingAgent, TyingReward
from ..model_card import write_model_card
from ..models.tied_blocks import RetieReport, TiedBlocksMixin
from ..models.tying_map import TyingMap
from ..models.tying_strategies import resolve_tying_map
from .optimizer_sync import rebuild_data_parallel, sync_optimizer_with_model
from .tying_config import TyingTrainingArguments
from .tying_plot import plot_tying_history

logger = logging.getLogger(__name__)

TYING_STATE_NAME = "tying_state.pt"
TYING_HISTORY_NAME = "tying_history.jsonl"
TYING_PLOT_NAME = "tying_map.png"


class TyingTrainer(Trainer):
    """A `transformers.Trainer` that learns (or fixes) which transformer blocks share weights.

    Args:
        model: a tied model (`TiedGPT2LMHeadModel`, `TiedBertForMaskedLM` or any `TiedBlocksMixin` model);
            any model for `tying_strategy="none"`.
        args: `TyingTrainingArguments`.
        reward_dataset: held-out examples for the reward (its first `reward_batch_size` examples form one
            fixed batch). Defaults to `eval_dataset`. Never pass the test split. Required for `dlt`.
        model_card_kwargs: extra keyword arguments of `hf_layertie.model_card.build_model_card`
            (`dataset_names`, `base_model`, ...) for the card written with every saved model.
        **kwargs: everything `Trainer` accepts.
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
        super().__init__(model=model, args=args, **kwargs)
        self.model_card_kwargs = dict(model_card_kwargs or {})
        self.tying_records: list[dict] = []
        self.tying_seconds = 0.0  # wall time spent deciding, measuring rewards and re-tying (the agent's overhead)
        self.agent: TyingAgent | None = None
        self._last_decision_step: int | None = None
        self._loss_at_last_decision: float | None = None  # held-out loss when the pending action was taken
        self._reward_examples = None
        self._reward_batch = None
        if args.tying_mode == "none":
            return
        self._check_model_can_tie()
        if args.tying_mode == "static":
            self.model.retie(self._parse_map_argument(args.static_spec, "tying_strategy"))
            self._record({"step": 0, **self._map_fields()})
            return
        if args.ddp_static_graph:
            raise ValueError("ddp_static_graph=True cannot follow re-ties; leave it unset with a dynamic tying_strategy")
        if args.tying_initial_map is not None:
            self.model.retie(self._parse_map_argument(args.tying_initial_map, "tying_initial_map"))
        self.agent = TyingAgent(len(self.model.tied_blocks), self._agent_config())
        self.reward = TyingReward(
            block_cost=args.reward_block_cost,
            distinct_budget=args.reward_distinct_budget,
            budget_penalty=args.reward_budget_penalty,
            measure=args.reward_measure,
        )
        self._reward_examples = self._select_reward_examples(reward_dataset)

    # ----- construction helpers -----

    def _check_model_can_tie(self) -> None:
        if not isinstance(self.model, TiedBlocksMixin):
            raise ValueError(
                f"tying_strategy={self.args.tying_strategy!r} needs a model with tied blocks (TiedGPT2LMHeadModel, "
                f"TiedBertForMaskedLM or a TiedBlocksMixin model), got {type(self.model).__name__}; "
                f"use tying_strategy='none' for conventional training"
            )

    def _parse_map_argument(self, text: str, argument: str) -> TyingMap:
        try:
            return resolve_tying_map(text, len(self.model.tied_blocks))
        except ValueError as error:
            raise ValueError(f"{argument}={text!r} does not fit the model: {error}") from None

    def _agent_config(self) -> AgentConfig:
        args = self.args
        if args.tying_mode == "random":  # the same schedule, every action uniformly random
            epsilon_start = epsilon_decay = epsilon_min = 1.0
        else:
            epsilon_start, epsilon_decay, epsilon_min = args.epsilon_start, args.epsilon_decay, args.epsilon_min
        return AgentConfig(
            hidden_size=args.q_hidden_size,
            learning_rate=args.q_learning_rate,
            gamma=args.q_gamma,
            epsilon_start=epsilon_start,
            epsilon_decay=epsilon_decay,
            epsilon_min=epsilon_min,
            seed=args.agent_seed,
        )

    def _select_reward_examples(self, reward_dataset):
        dataset = reward_dataset if reward_dataset is not None else self.eval_dataset
        if isinstance(dataset, dict):
            raise ValueError("reward_dataset: several eval datasets were given; pass the held-out reward data explicitly")
        if dataset is None or len(dataset) == 0:
            if self.args.tying_mode == "dlt":
                raise ValueError(
                    "tying_strategy='dlt' needs held-out data for its reward: pass reward_dataset= (or eval_dataset=), "
                    "never the test split"
                )
            return None
        count = min(self.args.reward_batch_size, len(dataset))
        if hasattr(dataset, "select"):
            return self._remove_unused_columns(dataset.select(range(count)), description="reward")
        return [dataset[index] for index in range(count)]

    # ----- the decision, inside training_step -----

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.agent is not None and self._decision_due():
            self._decide_and_retie()
        # After a re-tie the DDP wrapper was rebuilt in place; `model_wrapped` is always the live one.
        return super().training_step(self.model_wrapped, inputs, num_items_in_batch)

    def _decision_due(self) -> bool:
        step = self.state.global_step
        return step % self.args.tying_interval == 0 and step != self._last_decision_step

    def _decide_and_retie(self) -> None:
        started = time.perf_counter()
        self._last_decision_step = self.state.global_step
        record = self._decide() if self.is_world_process_zero() else None
        if self.args.world_size > 1:
            record = broadcast_object_list([record], from_process=0)[0]
        report = self.model.retie(record["map"])
        self._follow_retie(report)
        record.update(self._map_fields())
        self.tying_seconds += time.perf_counter() - started
        self._record(record)

    def _decide(self) -> dict:
        """Rank 0: learn from the previous decision's reward, then propose the next decision."""
        current = self.model.tying_map
        outcome = {}
        if self._reward_examples is not None:
            held_out_loss = self._held_out_loss()
            outcome["held_out_loss"] = held_out_loss
            if self.agent.pending:
                reward = self.reward(held_out_loss, current, loss_before=self._loss_at_last_decision)
                outcome.update(reward=reward, q_loss=self.agent.learn(reward, current))
            self._loss_at_last_decision = held_out_loss
        decision = self.agent.propose(current)
        return {
            "step": self.state.global_step,
            "block": decision.block,
            "source": decision.source,
            "explored": decision.explored,
            "epsilon": decision.epsilon,
            "map": decision.new_map.to_list(),
            **outcome,
        }

    @torch.no_grad()
    def _held_out_loss(self) -> float:
        """Loss of the fixed reward batch, in eval mode (no dropout, no draw from the global RNG)."""
        if self._reward_batch is None:
            # Collate once under a forked RNG: masking collators draw random numbers, and the global RNG must not move.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.args.agent_seed)
                self._reward_batch = self.data_collator(list(self._reward_examples))
        model = self.model
        was_training = model.training
        model.eval()
        try:
            loss = model(**self._prepare_inputs(self._reward_batch)).loss
        finally:
            model.train(was_training)
        value = float(loss)
        if not math.isfinite(value):
            logger.warning(f"Held-out loss is {value} at step {self.state.global_step}; the agent will skip this reward")
        return value

    def _follow_retie(self, report: RetieReport) -> None:
        if not report.changed:
            return
        if self.optimizer is not None:
            sync_optimizer_with_model(self.optimizer, self.model, report)
        rebuild_data_parallel(self.model_wrapped)

    def _map_fields(self) -> dict:
        tying_map = self.model.tying_map
        counts = self.model.parameter_counts()
        return {
            "map": tying_map.to_list(),
            "map_text": tying_map.render(),
            "distinct_blocks": tying_map.num_distinct,
            "trainable_parameters": counts.trainable,
            "block_parameters": counts.blocks,
        }

    def _record(self, record: dict) -> None:
        self.tying_records.append(record)
        numbers = {
            f"tying/{key}": value
            for key, value in record.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("step",)
        }
        if self.state.global_step > 0 or self.is_in_train:
            self.log({**numbers, "tying/map": record["map_text"]})
        if self.args.should_save:
            os.makedirs(self.args.output_dir, exist_ok=True)
            with open(os.path.join(self.args.output_dir, TYING_HISTORY_NAME), "a") as history:
                history.write(json.dumps(record) + "\n")

    # ----- checkpoints, resume and saving -----

    def _tying_state(self) -> dict:
        return {
            "agent": self.agent.state_dict() if self.agent is not None else None,
            "records": self.tying_records,
            "last_decision_step": self._last_decision_step,
            "loss_at_last_decision": self._loss_at_last_decision,
        }

    def _save_checkpoint(self, model, trial) -> None:
        if self.args.tying_mode != "none" and self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            os.makedirs(folder, exist_ok=True)
            torch.save(self._tying_state(), os.path.join(folder, TYING_STATE_NAME))
        super()._save_checkpoint(model, trial)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        if self.args.tying_mode != "none":
            self.model.retie(_checkpoint_map(resume_from_checkpoint, len(self.model.tied_blocks)))
            self._load_tying_state(resume_from_checkpoint)
        super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_best_model(self) -> None:
        if self.args.tying_mode != "none" and self.state.best_model_checkpoint:
            self.model.retie(_checkpoint_map(self.state.best_model_checkpoint, len(self.model.tied_blocks)))
        super()._load_best_model()

    def _load_tying_state(self, checkpoint: str) -> None:
        path = os.path.join(checkpoint, TYING_STATE_NAME)
        if not os.path.isfile(path):
            if self.agent is not None:
                raise FileNotFoundError(f"{path} is missing: cannot resume the tying agent from {checkpoint}")
            return
        state = torch.load(path, map_location="cpu", weights_only=False)
        if self.agent is not None and state["agent"] is not None:
            self.agent.load_state_dict(state["agent"])
        self.tying_records = list(state["records"])
        self._last_decision_step = state["last_decision_step"]
        self._loss_at_last_decision = state["loss_at_last_decision"]
        if self.args.should_save:  # the history on disk restarts from the checkpoint, as the run does
            os.makedirs(self.args.output_dir, exist_ok=True)
            with open(os.path.join(self.args.output_dir, TYING_HISTORY_NAME), "w") as history:
                history.writelines(json.dumps(record) + "\n" for record in self.tying_records)

    def _issue_warnings_after_load(self, load_result) -> None:
        # Tied blocks are not stored in the checkpoint: they are restored by sharing, not missing.
        tied = getattr(self.model, "all_tied_weights_keys", {})
        load_result.missing_keys[:] = [key for key in load_result.missing_keys if key not in tied]
        super()._issue_warnings_after_load(load_result)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the model, then its tying plot and model card beside it."""
        super().save_model(output_dir, _internal_call)
        if self.args.should_save and isinstance(self.model, TiedBlocksMixin):
            self._write_plot_and_card(Path(output_dir if output_dir is not None else self.args.output_dir))

    def create_model_card(self, model_name: str | None = None, eval_results: dict | None = None, **kwargs) -> None:
        """Write the hf-layertie card (map, distinct blocks, parameters, results, plot, loading code) as README.md.

        Called by `Trainer.push_to_hub`; `eval_results` defaults to the last evaluation in the log history.
        """
        if not isinstance(self.model, TiedBlocksMixin):
            return super().create_model_card(model_name=model_name, **kwargs)
        if self.is_world_process_zero():
            self._write_plot_and_card(Path(self.args.output_dir), model_name=model_name, eval_results=eval_results)

    def _write_plot_and_card(self, output_dir: Path, model_name: str | None = None, eval_results: dict | None = None):
        plot = None
        if self.args.tying_plot and self.tying_records:
            plot = plot_tying_history(self.tying_records, output_dir / TYING_PLOT_NAME, final_step=self.state.global_step)
        write_model_card(
            self.model,
            output_dir,
            training_args=self.args,
            eval_results=eval_results if eval_results is not None else self._last_eval_metrics(),
            tying_plot=plot,
            model_name=model_name or self.args.hub_model_id or output_dir.name,
            **self.model_card_kwargs,
        )

    def _last_eval_metrics(self) -> dict:
        evaluations = [entry for entry in self.state.log_history if "eval_loss" in entry]
        if not evaluations:
            return {}
        loss = evaluations[-1]["eval_loss"]
        return {"eval_loss": loss, "perplexity": math.exp(min(loss, 700.0))}


def _checkpoint_map(checkpoint: str, num_blocks: int) -> TyingMap:
    """The map saved in a checkpoint's config.json (independent blocks when it has none)."""
    with open(os.path.join(checkpoint, "config.json")) as config_file:
        entries = json.load(config_file).get("tying_map")
    return TyingMap.independent(num_blocks) if entries is None else TyingMap(entries, num_blocks=num_blocks)
