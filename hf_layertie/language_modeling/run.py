"""The workflow behind `run_clm.py` and `run_mlm.py`: one code path, two tasks.

Parse arguments -> load and check data -> tokenizer and (tied) model -> TyingTrainer -> train
(resuming from the last checkpoint in `output_dir` if there is one) -> evaluate (perplexity =
exp(eval loss)) -> save the model, its card and the tying plot (and push them if asked).
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import datasets
import transformers
from transformers import (
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    PreTrainedTokenizerBase,
    default_data_collator,
    set_seed,
)
from transformers.trainer_utils import get_last_checkpoint

from ..data import embedded_tokenizer_dir
from ..models import TiedBertConfig, TiedBertForMaskedLM, TiedGPT2Config, TiedGPT2LMHeadModel
from ..trainer import TyingTrainer, TyingTrainingArguments
from .arguments import DataTrainingArguments, ModelArguments, parse_command_line
from .data import hold_out_reward_batch, load_raw_datasets, resolve_block_size, text_column, tokenize_and_group

logger = logging.getLogger(__name__)

DEFAULTS_DIR = Path(__file__).resolve().parent / "defaults"


@dataclass(frozen=True)
class LanguageModelingTask:
    """What differs between causal and masked language modeling; everything else is shared."""

    name: str
    config_class: type
    model_class: type
    embedded_tokenizer: str
    masked: bool

    @property
    def default_arguments(self) -> Path:
        return DEFAULTS_DIR / f"{self.name}_default.json"


CAUSAL_LM = LanguageModelingTask("clm", TiedGPT2Config, TiedGPT2LMHeadModel, "gpt2", masked=False)
MASKED_LM = LanguageModelingTask("mlm", TiedBertConfig, TiedBertForMaskedLM, "bert-base-uncased", masked=True)
ArgumentTuple = tuple[ModelArguments, DataTrainingArguments, TyingTrainingArguments]


def parse_arguments(task: LanguageModelingTask, argv: list[str] | None = None) -> ArgumentTuple:
    """Flags, or one .json / .yaml file of them; no arguments at all runs the task's embedded default."""
    return parse_command_line(
        (ModelArguments, DataTrainingArguments, TyingTrainingArguments), argv, default_file=task.default_arguments
    )


def load_tokenizer(task: LanguageModelingTask, model_args: ModelArguments) -> PreTrainedTokenizerBase:
    name = model_args.tokenizer_name or model_args.model_name_or_path or "embedded"
    source = embedded_tokenizer_dir(task.embedded_tokenizer) if name == "embedded" else name
    tokenizer = AutoTokenizer.from_pretrained(
        source, cache_dir=model_args.cache_dir, revision=model_args.model_revision, trust_remote_code=model_args.trust_remote_code
    )
    if task.masked and (tokenizer.mask_token is None or tokenizer.pad_token is None):
        raise ValueError(
            f"--tokenizer_name {name}: masked language modeling needs a tokenizer with a mask token and a pad token, "
            f"this one has mask_token={tokenizer.mask_token!r} and pad_token={tokenizer.pad_token!r}"
        )
    return tokenizer


def load_model(task: LanguageModelingTask, model_args: ModelArguments, tokenizer: PreTrainedTokenizerBase):
    """A checkpoint (tied or plain) into the tied class, or a new model from the task's config."""
    if model_args.model_name_or_path is not None:
        return task.model_class.from_pretrained(
            model_args.model_name_or_path,
            cache_dir=model_args.cache_dir,
            revision=model_args.model_revision,
            trust_remote_code=model_args.trust_remote_code,
        )
    special_ids = {
        key: getattr(tokenizer, key)
        for key in ("bos_token_id", "eos_token_id", "pad_token_id")
        if getattr(tokenizer, key) is not None
    }
    config = task.config_class(vocab_size=len(tokenizer), **special_ids)
    if model_args.config_overrides is not None:
        config.update_from_string(model_args.config_overrides)
        logger.info(f"Config overridden with {model_args.config_overrides}")
    return task.model_class(config)


def run(task: LanguageModelingTask, argv: list[str] | None = None) -> dict[str, float]:
    """Train and/or evaluate; returns the metrics (also written to `output_dir/all_results.json`)."""
    model_args, data_args, training_args = parse_arguments(task, argv)
    set_up_logging(training_args)
    set_seed(training_args.seed)

    raw = load_raw_datasets(data_args, model_args)
    column = text_column(raw, data_args.text_column_name)
    tokenizer = load_tokenizer(task, model_args)
    model = load_model(task, model_args, tokenizer)
    block_size = resolve_block_size(data_args.block_size, model.config.max_position_embeddings)
    grouped = tokenize_and_group(
        raw,
        tokenizer,
        column,
        block_size,
        training_args,
        num_proc=data_args.preprocessing_num_workers,
        special_tokens_mask=task.masked,
    )
    train_dataset, reward_dataset = hold_out_reward_batch(grouped["train"], training_args.reward_batch_size)
    train_dataset = _truncate(train_dataset, data_args.max_train_samples)
    eval_dataset = _truncate(grouped["validation"], data_args.max_eval_samples)
    collator = (
        DataCollatorForLanguageModeling(tokenizer, mlm_probability=data_args.mlm_probability)
        if task.masked
        else default_data_collator
    )
    trainer = TyingTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset if training_args.do_train else None,
        eval_dataset=eval_dataset if training_args.do_eval else None,
        reward_dataset=reward_dataset,
        processing_class=tokenizer,
        data_collator=collator,
        model_card_kwargs={
            "dataset_names": [_dataset_label(data_args)],
            "base_model": model_args.model_name_or_path,
        },
    )

    metrics: dict[str, float] = {}
    if training_args.do_train:
        train_result = trainer.train(resume_from_checkpoint=checkpoint_to_resume(training_args))
        trainer.save_model()
        metrics.update(train_result.metrics, train_samples=len(train_dataset))
        trainer.log_metrics("train", train_result.metrics)
        trainer.save_state()
    if training_args.do_eval:
        eval_metrics = trainer.evaluate()
        eval_metrics["eval_samples"] = len(eval_dataset)
        eval_metrics["perplexity"] = _perplexity(eval_metrics["eval_loss"])
        trainer.log_metrics("eval", eval_metrics)
        metrics.update(eval_metrics)
    trainer.save_metrics("all", metrics)
    trainer.create_model_card()  # the card takes eval_loss and perplexity from the last evaluation
    if training_args.push_to_hub:
        trainer.push_to_hub()
    return metrics


def set_up_logging(training_args: TyingTrainingArguments) -> None:
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", datefmt="%m/%d/%Y %H:%M:%S", handlers=[logging.StreamHandler(sys.stdout)]
    )
    level = training_args.get_process_log_level()
    logging.getLogger("hf_layertie").setLevel(level)
    datasets.utils.logging.set_verbosity(level)
    transformers.utils.logging.set_verbosity(level)


def _truncate(dataset: datasets.Dataset, limit: int | None) -> datasets.Dataset:
    return dataset if limit is None else dataset.select(range(min(limit, len(dataset))))


def checkpoint_to_resume(training_args: TyingTrainingArguments) -> str | None:
    """An explicit --resume_from_checkpoint, else the last checkpoint in output_dir: a crashed run picks up where it was."""
    if training_args.resume_from_checkpoint is not None:
        return training_args.resume_from_checkpoint
    if Path(training_args.output_dir).is_dir():
        last = get_last_checkpoint(training_args.output_dir)
        if last is not None:
            logger.info(f"Resuming from {last}, the last checkpoint in {training_args.output_dir}")
        return last
    return None


def _dataset_label(data_args: DataTrainingArguments) -> str:
    if data_args.dataset_name is not None:
        return data_args.dataset_name
    if data_args.train_file is not None:
        return Path(data_args.train_file).name
    return "shakespeare"


def _perplexity(loss: float) -> float:
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf
