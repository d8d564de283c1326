"""The metrics shipped as `evaluate` modules load offline and compute what they document."""

import math
import re

import evaluate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_layertie.metrics import METRIC_NAMES, load_metric, metric_dir


@pytest.fixture(scope="module")
def accuracy():
    return load_metric("lambada_accuracy")


@pytest.fixture(scope="module")
def perplexity():
    return load_metric("perplexity_from_nll")


@pytest.mark.parametrize("name", METRIC_NAMES)
def test_shipped_metric_loads_offline_with_evaluate(name):
    metric = evaluate.load(str(metric_dir(name)))
    assert isinstance(metric, evaluate.Metric)
    assert metric.name == name


@pytest.mark.parametrize("name", METRIC_NAMES)
def test_metric_module_has_one_import_per_line(name):
    """evaluate reads `import datasets, evaluate` as a dependency named "datasets,"."""
    source = (metric_dir(name) / f"{name}.py").read_text()
    assert not re.search(r"^\s*import [^\n]*,", source, flags=re.MULTILINE)


def test_unknown_metric_name_lists_the_shipped_ones():
    with pytest.raises(ValueError, match=r"unknown metric 'accuracy'.*lambada_accuracy.*perplexity_from_nll"):
        load_metric("accuracy")


words = st.sampled_from([" door", " Door", "door", " dog"])
pairs = st.lists(st.tuples(words, words), min_size=1)


@settings(max_examples=25, deadline=None)
@given(pairs=pairs)
def test_accuracy_is_the_share_of_exact_string_matches(accuracy, pairs):
    predictions, references = map(list, zip(*pairs))
    expected = sum(p == r for p, r in pairs) / len(pairs)
    assert accuracy.compute(predictions=predictions, references=references)["accuracy"] == pytest.approx(expected)


def test_accuracy_does_not_normalise_case_or_spaces(accuracy):
    result = accuracy.compute(predictions=[" Door", "door", " door"], references=[" door", " door", " door"])
    assert result["accuracy"] == pytest.approx(1 / 3)


def test_accuracy_on_token_ids_needs_every_token(accuracy):
    result = accuracy.compute(predictions=[[6729, 805], [6729, 7207], [6729]], references=[[6729, 805]] * 3)
    assert result["accuracy"] == pytest.approx(1 / 3)


examples = st.lists(st.tuples(st.floats(0, 50), st.integers(1, 20)), min_size=1, max_size=10)


@settings(max_examples=25, deadline=None)
@given(examples=examples)
def test_perplexity_is_exp_of_total_nll_over_total_tokens(perplexity, examples):
    nlls, counts = map(list, zip(*examples))
    result = perplexity.compute(negative_log_likelihoods=nlls, token_counts=counts)
    assert result["perplexity"] == pytest.approx(math.exp(sum(nlls) / sum(counts)))


def test_perplexity_with_one_count_per_example_is_per_example(perplexity):
    result = perplexity.compute(negative_log_likelihoods=[1.0, 3.0], token_counts=[1, 1])
    assert result["perplexity"] == pytest.approx(math.exp(2.0))


def test_perplexity_beyond_float_range_is_infinite(perplexity):
    assert perplexity.compute(negative_log_likelihoods=[800.0], token_counts=[1])["perplexity"] == math.inf


@pytest.mark.parametrize(
    ("nlls", "counts", "message"),
    [
        ([1.0, -0.5], [1, 1], r"negative_log_likelihoods\[1\] must be finite and >= 0, got -0.5"),
        ([float("nan")], [1], r"negative_log_likelihoods\[0\] must be finite"),
        ([1.0], [-2], r"token_counts\[0\] must be >= 0, got -2"),
        ([0.0], [0], "at least one token"),
        ([2.0, 1.5], [3, 0], r"negative_log_likelihoods\[1\] is 1.5 over token_counts\[1\] = 0 tokens"),
    ],
)
def test_perplexity_rejects_bad_input_by_index(perplexity, nlls, counts, message):
    with pytest.raises(ValueError, match=message):
        perplexity.compute(negative_log_likelihoods=nlls, token_counts=counts)


def test_hop_accuracy_reports_accuracy_per_hop_count_and_their_mean():
    scores = load_metric("hop_accuracy").compute(predictions=[4, 5, 6, 1], references=[4, 5, 7, 1], hops=[1, 2, 2, 3])
    assert scores == {"accuracy": 0.75, "mean_accuracy": pytest.approx((1 + 0.5 + 1) / 3), "accuracy_by_hops": {1: 1.0, 2: 0.5, 3: 1.0}}


def test_an_accuracy_of_no_example_is_refused_clearly():
    with pytest.raises(ValueError, match="hop_accuracy needs at least one prediction"):
        load_metric("hop_accuracy").compute(predictions=[], references=[], hops=[])
