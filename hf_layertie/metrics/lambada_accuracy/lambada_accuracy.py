"""LAMBADA last-word accuracy: the share of passages whose target word the model predicts exactly."""

import datasets
import evaluate

_DESCRIPTION = """
Last-word accuracy for LAMBADA (Paperno et al., 2016): a passage counts as correct only when the
prediction equals the target exactly. No normalisation is applied (no lower-casing, no stripping of
punctuation or spaces): the standard protocol (GPT-2, lm-eval-harness `lambada_openai`) asks that
greedy decoding produce every token of the target, so compare token ids where you have them.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[str]` or `list[list[int]]`): the predicted last words, or the greedy token ids
        predicted at the target positions.
    references (`list[str]` or `list[list[int]]`): the target words, or their token ids. Both
        arguments must be of the same kind.
Returns:
    accuracy (`float`): fraction of exact matches, in [0, 1].
Examples:
    >>> metric = evaluate.load("hf_layertie/metrics/lambada_accuracy")
    >>> metric.compute(predictions=[" door", " cat"], references=[" door", " dog"])
    {'accuracy': 0.5}
    >>> metric.compute(predictions=[[2147, 13]], references=[[2147, 14]])
    {'accuracy': 0.0}
"""

_CITATION = """
@inproceedings{paperno2016lambada,
  title={The {LAMBADA} dataset: Word prediction requiring a broad discourse context},
  author={Paperno, Denis and Kruszewski, Germ{\\'a}n and Lazaridou, Angeliki and Pham, Ngoc Quan and
          Bernardi, Raffaella and Pezzelle, Sandro and Baroni, Marco and Boleda, Gemma and Fern{\\'a}ndez, Raquel},
  booktitle={ACL},
  year={2016}
}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class LambadaAccuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features(
                    {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
                ),
                datasets.Features(
                    {
                        "predictions": datasets.Sequence(datasets.Value("int64")),
                        "references": datasets.Sequence(datasets.Value("int64")),
                    }
                ),
            ],
        )

    def _compute(self, predictions, references):
        matches = sum(list(prediction) == list(reference) for prediction, reference in zip(predictions, references))
        return {"accuracy": matches / len(references)}
