"""Perplexity aggregated from per-example summed negative log-likelihoods and token counts."""

import math

import datasets
import evaluate

_DESCRIPTION = """
Perplexity = exp(total NLL / total tokens), from each example's summed negative log-likelihood
(natural log) and the number of tokens it covers. Aggregating sums rather than averaging
per-example perplexities weights every token equally, whatever the example lengths. Pass a token
count of 1 per example to get a per-example (e.g. per-word) perplexity instead, as lm-eval-harness
reports for LAMBADA.
"""

_KWARGS_DESCRIPTION = """
Args:
    negative_log_likelihoods (`list[float]`): per example, the sum over its tokens of -log p(token).
        Each must be finite and >= 0 (a negative value usually means log-probabilities were passed).
    token_counts (`list[int]`): per example, how many tokens that sum covers (>= 0, total > 0).
Returns:
    perplexity (`float`): exp(sum(negative_log_likelihoods) / sum(token_counts)).
Examples:
    >>> metric = evaluate.load("hf_layertie/metrics/perplexity_from_nll")
    >>> metric.compute(negative_log_likelihoods=[2.0, 1.0], token_counts=[2, 1])
    {'perplexity': 2.718281828459045}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class PerplexityFromNll(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"negative_log_likelihoods": datasets.Value("float64"), "token_counts": datasets.Value("int64")}
            ),
        )

    def _compute(self, negative_log_likelihoods, token_counts):
        for index, (nll, count) in enumerate(zip(negative_log_likelihoods, token_counts)):
            if not math.isfinite(nll) or nll < 0:
                raise ValueError(f"negative_log_likelihoods[{index}] must be finite and >= 0, got {nll}")
            if count < 0:
                raise ValueError(f"token_counts[{index}] must be >= 0, got {count}")
            if count == 0 and nll > 0:  # a loss over no token: a count and its loss do not belong together
                raise ValueError(f"negative_log_likelihoods[{index}] is {nll} over token_counts[{index}] = 0 tokens")
        total_tokens = sum(token_counts)
        if total_tokens == 0:
            raise ValueError("token_counts must add up to at least one token, got 0")
        mean_nll = sum(negative_log_likelihoods) / total_tokens
        try:
            return {"perplexity": math.exp(mean_nll)}
        except OverflowError:  # mean NLL above ~709 nats: beyond float range
            return {"perplexity": math.inf}
