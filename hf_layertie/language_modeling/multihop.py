"""`run_clm.py --dataset_name multihop`: the multi-hop reference task (`hf_layertie.data.multihop`) as a workflow:
its datasets and tokenizer instead of text, and accuracy per hop count after the evaluation loss."""

from __future__ import annotations

import datasets
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..data.multihop import IGNORE_INDEX, MultiHopConfig, multihop_datasets, multihop_tokenizer
from ..metrics import load_metric

MULTIHOP = "multihop"


def load_multihop(config_text: str | None, seed: int) -> tuple[datasets.DatasetDict, PreTrainedTokenizerBase]:
    """The task's splits and tokenizer from `--dataset_config_name` (`"num_chains=4,max_hops=6"`)."""
    try:
        config = MultiHopConfig.from_string(config_text)
    except ValueError as error:
        raise ValueError(f"--dataset_config_name {config_text!r}: {error}") from None
    return multihop_datasets(config, seed=seed), multihop_tokenizer(config)


def check_multihop_fits(splits: datasets.DatasetDict, context: int, config_text: str | None) -> None:
    length = len(splits["train"][0]["input_ids"])
    if length > context:
        raise ValueError(
            f"--dataset_name multihop with {config_text or 'the default settings'} needs {length} positions; the model "
            f"has {context} (from scratch, raise n_positions in --config_overrides)"
        )


@torch.no_grad()
def evaluate_multihop(model: PreTrainedModel, dataset: datasets.Dataset, batch_size: int) -> dict:
    """Greedy prediction of every answer token; accuracy overall, averaged over hop counts, and per hop count."""
    was_training = model.training
    model.eval()
    predictions, references, hops = [], [], []
    try:
        for start in range(0, len(dataset), batch_size):
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
    return load_metric(MULTIHOP + "_accuracy").compute(predictions=predictions, references=references, hops=hops)


def multihop_metrics(scores: dict) -> dict[str, float]:
    """`evaluate_multihop`'s scores as flat `eval_*` metrics (`eval_accuracy_hops_3`, ...)."""
    metrics = {"eval_accuracy": scores["accuracy"], "eval_mean_accuracy": scores["mean_accuracy"]}
    metrics.update({f"eval_accuracy_hops_{hop}": value for hop, value in scores["accuracy_by_hops"].items()})
    return metrics


def print_multihop_report(metrics: dict) -> None:
    """Accuracy per hop count, after training (what `run_clm.py` prints for this task)."""
    hops = sorted(int(key.rsplit("_", 1)[1]) for key in metrics if key.startswith("eval_accuracy_hops_"))
    print(f"\n***** multi-hop accuracy ({metrics['eval_samples']} evaluation examples) *****")
    print("  hops      " + "  ".join(f"{hop:>5}" for hop in hops) + "   mean over hops")
    print("  accuracy  " + "  ".join(f"{metrics[f'eval_accuracy_hops_{hop}']:>5.2f}" for hop in hops) + f"   {metrics['eval_mean_accuracy']:.3f}")
