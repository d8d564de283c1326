"""`run_clm.py --dataset_name hop_induction | word_problem`: the generated tasks, where depth should matter, as a
workflow: their datasets and tokenizer instead of text, and accuracy per hop count (per position, for the word
problem) after the evaluation loss. `hop_induction` is k-hop induction (`hf_layertie.data.hop_induction`),
`word_problem` the running product of group elements (`hf_layertie.data.word_problem`), both with a label at every
position; what the tasks share is `hf_layertie.data.generated_tasks`. A new task is one more entry of `HOP_TASKS`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import datasets
import torch
from accelerate.utils import gather_object
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..data.generated_tasks import IGNORE_INDEX
from ..data.hop_induction import HopInductionConfig, hop_induction_datasets, hop_induction_tokenizer
from ..data.word_problem import WordProblemConfig, word_problem_datasets, word_problem_tokenizer
from ..metrics import load_metric
from ..toolkit import this_process_share


class GeneratedTask(NamedTuple):
    """A generated task as `run_clm.py` runs it.

    Args:
        config_class: a frozen dataclass of the task's settings; `from_string` reads `--dataset_config_name` (None
            or empty: the defaults), `sequence_length` is the padded length of its examples.
        make_datasets: `(config, seed=...)` to the `train`, `validation` and `test` splits, with the columns
            `input_ids`, `attention_mask`, `labels` (`IGNORE_INDEX` where nothing is scored) and `answer_hops` (each
            label's hop count, in order), which `evaluate_hop_task` scores.
        make_tokenizer: the config to its tokenizer (the vocabulary follows the settings).
        example_settings: a `--dataset_config_name` to show in messages.
        scored_by: what `answer_hops` counts, as the printed report names it ("hops", "position").
    """

    config_class: type
    make_datasets: Callable[..., datasets.DatasetDict]
    make_tokenizer: Callable[[Any], PreTrainedTokenizerBase]
    example_settings: str
    scored_by: str = "hops"


# Every generated task by `--dataset_name`. Each writes the columns `evaluate_hop_task` reads, so one evaluation
# serves them all.
HOP_TASKS = {
    "hop_induction": GeneratedTask(HopInductionConfig, hop_induction_datasets, hop_induction_tokenizer, "length=64,max_hops=4"),
    # `answer_hops` holds each label's prefix length: accuracy "by hops" is accuracy by position.
    "word_problem": GeneratedTask(WordProblemConfig, word_problem_datasets, word_problem_tokenizer, "group=A5,length=16", "position"),
}
# Tasks that were offered and are no more, with why: `--dataset_name` refuses them by name rather than looking for a
# Hub dataset of that name.
REMOVED_TASKS = {
    "multihop": "chains of variable references, removed after no small model learned a second hop on them: bench/README.md, "
    "'Before it: chains of references'",
}
def check_removed_task(name: str | None) -> None:
    """Refuse a `--dataset_name` of a generated task that was removed, naming the tasks there are."""
    if name in REMOVED_TASKS:
        raise ValueError(
            f"--dataset_name {name}: the generated task {name} ({REMOVED_TASKS[name]}) is no longer offered; the "
            f"generated tasks are {', '.join(sorted(HOP_TASKS))}"
        )


def hop_task_config(name: str, config_text: str | None):
    """The task's settings from `--dataset_config_name` (`"length=64,max_hops=4"`; nothing is generated)."""
    try:
        return HOP_TASKS[name].config_class.from_string(config_text)
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
    return HOP_TASKS[name].make_tokenizer(hop_task_config(name, config_text))


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
    return HOP_TASKS[name].make_datasets(config, seed=seed)


@torch.no_grad()
def evaluate_hop_task(model: PreTrainedModel, dataset: datasets.Dataset, batch_size: int) -> dict:
    """Greedy prediction of every answer token; accuracy overall, averaged over hop counts, and per hop count.

    Under several processes (`accelerate launch`) each predicts its share of the batches and every process gets the
    whole set's scores (collective: call it on every process, with an unsharded model)."""
    starts = this_process_share(model, range(0, len(dataset), batch_size), "evaluate_hop_task")
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
    return load_metric("hop_accuracy").compute(predictions=predictions, references=references, hops=hops)


def hop_task_metrics(scores: dict) -> dict[str, float]:
    """`evaluate_hop_task`'s scores as flat `eval_*` metrics (`eval_accuracy_hops_3`, ...)."""
    metrics = {"eval_accuracy": scores["accuracy"], "eval_mean_accuracy": scores["mean_accuracy"]}
    metrics.update({f"eval_accuracy_hops_{hop}": value for hop, value in scores["accuracy_by_hops"].items()})
    return metrics


def print_hop_task_report(metrics: dict, task: str = "hop_induction") -> None:
    """Accuracy per hop count (per position for the word problem: `GeneratedTask.scored_by`), after training (what
    `run_clm.py` prints for a generated task); nothing for a run that evaluated nothing."""
    if "eval_mean_accuracy" not in metrics:
        return
    unit = HOP_TASKS[task].scored_by
    hops = sorted(int(key.rsplit("_", 1)[1]) for key in metrics if key.startswith("eval_accuracy_hops_"))
    print(f"\n***** {'multi-hop' if unit == 'hops' else task} accuracy ({metrics['eval_samples']} evaluation examples) *****")
    print(f"  {unit:<10}" + "  ".join(f"{hop:>5}" for hop in hops) + f"   mean over {'hops' if unit == 'hops' else 'positions'}")
    print("  accuracy  " + "  ".join(f"{metrics[f'eval_accuracy_hops_{hop}']:>5.2f}" for hop in hops) + f"   {metrics['eval_mean_accuracy']:.3f}")
