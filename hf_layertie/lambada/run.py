"""The workflow behind `run_lambada.py`: evaluate a causal checkpoint on LAMBADA, optionally after fine-tuning on it.

- `--do_eval` alone: the standard protocol over every passage of `--lambada_file`.
- `--do_train`: fine-tune on the passages before the fixed hold-out (`lambada_finetune_split`: the last
  `--eval_fraction` of the file), with the tying strategy of the training arguments; `--do_eval` then
  scores the held-out passages only, never one that was trained on.

Metrics (`eval_lambada_accuracy`, `eval_lambada_perplexity`, ...) go through the Trainer's metrics
(`log_metrics`, `eval_results.json`) and into the model card.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from transformers import DataCollatorForLanguageModeling, set_seed

from ..language_modeling.arguments import ModelArguments, parse_command_line
from ..language_modeling.data import hold_out_reward_batch, resolve_block_size
from ..language_modeling.run import CAUSAL_LM, checkpoint_to_resume, load_model, load_tokenizer, set_up_logging
from ..trainer import TyingTrainer, TyingTrainingArguments
from .evaluation import evaluate_lambada
from .finetune import lambada_causal_lm_dataset, lambada_finetune_split
from .reader import read_lambada_jsonl


@dataclass
class LambadaArguments:
    """The LAMBADA data and how it is split and scored."""

    lambada_file: str | None = field(
        default=None, metadata={"help": "OpenAI-format LAMBADA JSON lines (one {\"text\": ...} per line)."}
    )
    eval_fraction: float = field(
        default=0.1, metadata={"help": "With --do_train: the last share of the file held out for evaluation."}
    )
    block_size: int | None = field(default=None, metadata={"help": "Fine-tuning: tokens kept per passage (from the end)."})
    lambada_batch_size: int = field(default=8, metadata={"help": "Passages per forward pass when scoring."})
    max_eval_passages: int | None = field(default=None, metadata={"help": "Score only the first N evaluation passages."})

    def __post_init__(self):
        if self.lambada_file is None:
            raise ValueError("--lambada_file is required: the path of an OpenAI-format lambada_test.jsonl")


def run_lambada(argv: list[str] | None = None) -> dict[str, float]:
    model_args, lambada_args, training_args = parse_command_line(
        (ModelArguments, LambadaArguments, TyingTrainingArguments), argv
    )
    if model_args.model_name_or_path is None:
        raise ValueError("--model_name_or_path is required: the causal checkpoint to evaluate or fine-tune")
    if not (training_args.do_train or training_args.do_eval):
        raise ValueError("Nothing to do: pass --do_eval, --do_train or both")
    set_up_logging(training_args)
    set_seed(training_args.seed)

    passages = read_lambada_jsonl(lambada_args.lambada_file)
    tokenizer = load_tokenizer(CAUSAL_LM, model_args)
    model = load_model(CAUSAL_LM, model_args, tokenizer)
    card = {"dataset_names": ["lambada"], "base_model": model_args.model_name_or_path}

    if training_args.do_train:
        train_passages, eval_passages = lambada_finetune_split(passages, lambada_args.eval_fraction)
        trainer = _fine_tune(model, tokenizer, train_passages, lambada_args, training_args, card)
    else:
        eval_passages = passages
        # Evaluation only: no tying decision runs, the checkpoint's own map is scored as it is.
        trainer = TyingTrainer(
            model=model,
            args=dataclasses.replace(training_args, tying_strategy="none", tying_initial_map=None),
            processing_class=tokenizer,
            model_card_kwargs=card,
        )

    metrics: dict[str, float] = {}
    if training_args.do_eval:
        if lambada_args.max_eval_passages is not None:
            eval_passages = eval_passages[: lambada_args.max_eval_passages]
        scores = evaluate_lambada(
            trainer.model,
            tokenizer,
            eval_passages,
            batch_size=lambada_args.lambada_batch_size,
            device=training_args.device,
            show_progress=not training_args.disable_tqdm,
        )
        metrics = {f"eval_{key}": value for key, value in scores.items()}
        trainer.log(metrics)
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
        trainer.create_model_card(eval_results={"lambada": scores})
    return metrics


def _fine_tune(model, tokenizer, passages, lambada_args, training_args, card) -> TyingTrainer:
    if tokenizer.pad_token is None:  # GPT-2 has none; padding positions are masked out of the loss
        tokenizer.pad_token = tokenizer.eos_token
    block_size = resolve_block_size(lambada_args.block_size, model.config.max_position_embeddings)
    train_dataset, reward_dataset = hold_out_reward_batch(
        lambada_causal_lm_dataset(passages, tokenizer, block_size), training_args.reward_batch_size
    )
    trainer = TyingTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        reward_dataset=reward_dataset,
        processing_class=tokenizer,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        model_card_kwargs=card,
    )
    result = trainer.train(resume_from_checkpoint=checkpoint_to_resume(training_args))
    trainer.save_model()
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    return trainer
