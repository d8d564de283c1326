"""`run_clm.py --dataset_name multihop | hop_induction`: the generated tasks where depth should matter, as a workflow:
their datasets and tokenizer instead of text, and accuracy per hop count after the evaluation loss. `multihop`
chains references (`hf_layertie.data.multihop`); `hop_induction` is k-hop induction, with a label at every
position (`hf_layertie.data.hop_induction`)."""

from __future__ import annotations

import datasets
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..data.hop_induction import HopInductionConfig, hop_induction_datasets, hop_induction_tokenizer
from ..data.multihop import IGNORE_INDEX, MultiHopConfig, multihop_datasets, multihop_tokenizer
from ..metrics import load_metric

MULTIHOP = "multihop"
# Every generated task by `--dataset_name`: its config class (`from_string` reads `--dataset_config_name`), its
# splits and its tokenizer. Each writes `multihop`'s columns, so one evaluation serves them all.
HOP_TASKS = {
    MULTIHOP: (MultiHopConfig, multihop_datasets, multihop_tokenizer),
    "hop_induction": (HopInductionConfig, hop_induction_datasets, hop_induction_tokenizer),
}


def load_hop_task(name: str, config_text: str | None, seed: int) -> tuple[datasets.DatasetDict, PreTrainedTokenizerBase]:
    """The task's splits and tokenizer from `--dataset_config_name` (`"num_chains=4,max_hops=6"`)."""
    config_class, make_datasets, make_tokenizer = HOP_TASKS[name]
    try:
        config = config_class.from_string(config_text)
    except ValueError as error:
        raise ValueError(f"--dataset_config_name {config_text!r}: {error}") from None
    return make_datasets(config, seed=seed), make_tokenizer(config)


def check_hop_task_fits(name: str, splits: datasets.DatasetDict, context: int, config_text: str | None) -> None:
    length = len(splits["train"][0]["input_ids"])
    if length > context:
        raise ValueError(
            f"--dataset_name {name} with {config_text or 'the default settings'} needs {length} positions; the model "
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
