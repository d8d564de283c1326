"""`run_clm.py --dataset_name multihop | hop_induction`: the generated tasks where depth should matter, as a workflow:
their datasets and tokenizer instead of text, and accuracy per hop count after the evaluation loss. `multihop`
chains references (`hf_layertie.data.multihop`); `hop_induction` is k-hop induction, with a label at every
position (`hf_layertie.data.hop_induction`)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import datasets
import torch
from accelerate.utils import gather_object
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..data.hop_induction import HopInductionConfig, hop_induction_datasets, hop_induction_tokenizer
from ..data.multihop import IGNORE_INDEX, MultiHopConfig, multihop_datasets, multihop_tokenizer
from ..metrics import load_metric
from ..toolkit import changed_from_default, this_process_share

if TYPE_CHECKING:
    from .arguments import DataTrainingArguments

MULTIHOP = "multihop"
# Every generated task by `--dataset_name`: its config class (`from_string` reads `--dataset_config_name`), its
# splits and its tokenizer. Each writes `multihop`'s columns, so one evaluation serves them all.
HOP_TASKS = {
    MULTIHOP: (MultiHopConfig, multihop_datasets, multihop_tokenizer),
    "hop_induction": (HopInductionConfig, hop_induction_datasets, hop_induction_tokenizer),
}
# Data arguments of text that a generated task has no use for: its examples, and their length, come from
# `--dataset_config_name`.
TEXT_ONLY_ARGUMENTS = (
    "train_file", "validation_file", "block_size", "text_column_name", "preprocessing_num_workers",
    "validation_split_percentage", "keep_linebreaks",
)  # fmt: skip
_EXAMPLE_SETTINGS = {MULTIHOP: "num_chains=4,max_hops=6", "hop_induction": "length=64,max_hops=4"}


def check_hop_task_arguments(data_args: DataTrainingArguments) -> None:
    """Refuse the text-only data arguments (they would be ignored) and read the task's settings, so that both are
    reported before anything loads."""
    name = data_args.dataset_name
    given = changed_from_default(data_args, TEXT_ONLY_ARGUMENTS)
    if given:
        raise ValueError(
            f"--dataset_name {name} generates its examples, and their length, from --dataset_config_name: it reads no "
            f"{', '.join(given)}. Leave {'it' if len(given) == 1 else 'them'} unset (sizes go in --dataset_config_name, "
            f"e.g. '{_EXAMPLE_SETTINGS[name]}')"
        )
    hop_task_config(name, data_args.dataset_config_name)


def hop_task_config(name: str, config_text: str | None) -> MultiHopConfig | HopInductionConfig:
    """The task's settings from `--dataset_config_name` (`"num_chains=4,max_hops=6"`; nothing is generated)."""
    try:
        return HOP_TASKS[name][0].from_string(config_text)
    except ValueError as error:
        raise ValueError(f"--dataset_config_name {config_text!r}: {error}") from None


def hop_task_label(name: str, config_text: str | None) -> str:
    """How a card names the task: its name and every setting, defaults included (the examples follow from them and
    the seed), e.g. `hop_induction (length=64,max_hops=4,...)`."""
    config = hop_task_config(name, config_text)
    settings = ",".join(f"{field.name}={getattr(config, field.name)}" for field in dataclasses.fields(config))
    return f"{name} ({settings})"


def hop_task_tokenizer(name: str, config_text: str | None) -> PreTrainedTokenizerBase:
    """The task's tokenizer (its vocabulary follows the settings)."""
    return HOP_TASKS[name][2](hop_task_config(name, config_text))


def load_hop_task(name: str, config_text: str | None, context: int, seed: int) -> datasets.DatasetDict:
    """The task's splits, generated once their examples' length is known to fit `context` positions (a model's):
    the length follows from the settings, and generating takes minutes and gigabytes at large sizes."""
    config = hop_task_config(name, config_text)
    if config.sequence_length > context:
        raise ValueError(
            f"--dataset_name {name} with {config_text or 'the default settings'} needs {config.sequence_length} "
            f"positions; the model has {context} (from scratch, raise n_positions / max_position_embeddings in "
            f"--config_overrides, or shorten the examples in --dataset_config_name)"
        )
    return HOP_TASKS[name][1](config, seed=seed)


@torch.no_grad()
def evaluate_multihop(model: PreTrainedModel, dataset: datasets.Dataset, batch_size: int) -> dict:
    """Greedy prediction of every answer token; accuracy overall, averaged over hop counts, and per hop count.

    Under several processes (`accelerate launch`) each predicts its share of the batches and every process gets the
    whole set's scores (collective: call it on every process, with an unsharded model)."""
    starts = this_process_share(model, range(0, len(dataset), batch_size), "evaluate_multihop")
    was_training = model.training
    model.eval()
    predictions, references, hops = [], [], []
    try:
        for start in starts:
            batch = dataset[start : start + batch_size]
            ids = torch.tensor(batch["input_ids"], device=model.device)
            mask = torch.tensor(batch["attention_mask"], device=model.device)
            predicted = model(input_ids=ids, attention_mask=mask).logits[:, :-1].argmax(-1).cpu()
            labels = torch.tensor(batch["labels"])[:, 1:]
            for row, row_hops in enumerate(batch["answer_hops"]):
                positions = (labels[row] != IGNORE_INDEX).nonzero().flatten()
                predictions += predicted[row, positions].tolist()
                references += labels[row, positions].tolist()
                hops += row_hops
    finally:
        model.train(was_training)
    predictions, references, hops = (gather_object(values) for values in (predictions, references, hops))  # counted: any order
    return load_metric(MULTIHOP + "_accuracy").compute(predictions=predictions, references=references, hops=hops)


def multihop_metrics(scores: dict) -> dict[str, float]:
    """`evaluate_multihop`'s scores as flat `eval_*` metrics (`eval_accuracy_hops_3`, ...)."""
    metrics = {"eval_accuracy": scores["accuracy"], "eval_mean_accuracy": scores["mean_accuracy"]}
    metrics.update({f"eval_accuracy_hops_{hop}": value for hop, value in scores["accuracy_by_hops"].items()})
    return metrics


def print_multihop_report(metrics: dict) -> None:
    """Accuracy per hop count, after training (what `run_clm.py` prints for this task); nothing for a run that
    evaluated nothing."""
    if "eval_mean_accuracy" not in metrics:
        return
    hops = sorted(int(key.rsplit("_", 1)[1]) for key in metrics if key.startswith("eval_accuracy_hops_"))
    print(f"\n***** multi-hop accuracy ({metrics['eval_samples']} evaluation examples) *****")
    print("  hops      " + "  ".join(f"{hop:>5}" for hop in hops) + "   mean over hops")
    print("  accuracy  " + "  ".join(f"{metrics[f'eval_accuracy_hops_{hop}']:>5.2f}" for hop in hops) + f"   {metrics['eval_mean_accuracy']:.3f}")
