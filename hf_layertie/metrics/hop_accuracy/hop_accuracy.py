"""Hop accuracy: the share of answers predicted exactly, overall and per number of hops."""

import datasets
import evaluate

_DESCRIPTION = """
Accuracy of the answers of a generated task (`hf_layertie.data.generated_tasks`), each with its number of hops:
in k-hop induction (`hf_layertie.data.hop_induction`) every labelled position is an answer and its number of hops
is the example's k. Accuracy per hop count shows how many hops a model can follow; `mean_accuracy` averages the hop
counts with equal weight (however many answers each has).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[int]`): the predicted token of each answer.
    references (`list[int]`): the answer tokens.
    hops (`list[int]`): each answer's number of hops.
Returns:
    accuracy (`float`): exact matches over all answers.
    mean_accuracy (`float`): the mean of the per-hop accuracies.
    accuracy_by_hops (`dict[int, float]`): accuracy of the answers of each hop count.
Examples:
    >>> metric = evaluate.load("hf_layertie/metrics/hop_accuracy")
    >>> metric.compute(predictions=[4, 5, 6], references=[4, 5, 7], hops=[1, 2, 2])
    {'accuracy': 0.6666666666666666, 'mean_accuracy': 0.75, 'accuracy_by_hops': {1: 1.0, 2: 0.5}}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class HopAccuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("int64"), "references": datasets.Value("int64"), "hops": datasets.Value("int64")}
            ),
        )

    def _compute(self, predictions, references, hops):
        if not references:
            raise ValueError("hop_accuracy needs at least one prediction, reference and hop count, got none")
        correct_by_hops, count_by_hops = {}, {}
        for prediction, reference, hop in zip(predictions, references, hops):
            correct_by_hops[hop] = correct_by_hops.get(hop, 0) + int(prediction == reference)
            count_by_hops[hop] = count_by_hops.get(hop, 0) + 1
        by_hops = {hop: correct_by_hops[hop] / count_by_hops[hop] for hop in sorted(count_by_hops)}
        return {
            "accuracy": sum(correct_by_hops.values()) / len(references),
            "mean_accuracy": sum(by_hops.values()) / len(by_hops),
            "accuracy_by_hops": by_hops,
        }
