"""bench/run_bench.py: the tiny preset end to end (every strategy, ratios, distinct counts, memory sweep, plots)."""

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest
from hypothesis import given
from hypothesis import strategies as st

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # `bench` is a folder of the repository, not part of the installed package

from bench import report  # noqa: E402
from bench.settings import BenchArguments, distinct_counts, resolve_settings  # noqa: E402

TINY_BLOCKS = 4


@pytest.fixture(scope="module")
def tiny_bench(tmp_path_factory):
    """One run of the whole tiny bench, as a user types it, shared by the tests of this file."""
    results = tmp_path_factory.mktemp("bench") / "tiny"
    completed = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "run_bench.py"), "--preset", "tiny", "--results_dir", str(results)],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=600,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return results, json.loads((results / "results.json").read_text())


def _by_strategy(results: dict) -> dict[str, dict]:
    return {run["strategy"]: run for run in results["runs"]}


@pytest.mark.slow
def test_every_strategy_is_in_the_json_and_the_table(tiny_bench):
    folder, results = tiny_bench
    runs = _by_strategy(results)
    distinct = runs["dlt"]["distinct_blocks"]
    expected = {
        "none", "dlt", "random", "static:all", f"static:sequence:{distinct}", f"static:cycle:{distinct}",
        f"static:cycle_rev:{distinct}", "static:sandwich",
    }  # fmt: skip
    assert set(runs) == expected and len(results["runs"]) == len(expected)
    table = (folder / "results.md").read_text()
    for strategy in expected:
        assert table.count(f"| `{strategy}` |") == 1, f"{strategy} has no row of its own in results.md"
    for strategy in expected:  # each run was its own process, with its own log
        assert (folder / "runs" / strategy.replace(":", "-") / "log.txt").is_file()


@pytest.mark.slow
def test_ratios_are_against_the_none_run(tiny_bench):
    _, results = tiny_bench
    runs = _by_strategy(results)
    baseline = runs["none"]
    assert all(ratio == 1.0 for ratio in baseline["ratios_vs_none"].values())
    for strategy, run in runs.items():
        for key, ratio in run["ratios_vs_none"].items():
            assert ratio is not None and math.isfinite(ratio), f"{strategy}: ratio of {key} is {ratio}"
        assert run["ratios_vs_none"]["shakespeare_perplexity"] == pytest.approx(
            run["shakespeare_perplexity"] / baseline["shakespeare_perplexity"]
        )
        assert run["ratios_vs_none"]["state_bytes_total"] == pytest.approx(
            run["state_bytes"]["total"] / baseline["state_bytes"]["total"]
        )


@pytest.mark.slow
def test_runs_end_with_the_distinct_blocks_of_their_strategy(tiny_bench):
    _, results = tiny_bench
    runs = _by_strategy(results)
    distinct = runs["dlt"]["distinct_blocks"]
    expected = {"none": TINY_BLOCKS, "static:all": 1, "static:sandwich": 3}
    expected.update({f"static:{name}:{distinct}": distinct for name in ("sequence", "cycle", "cycle_rev")})
    for strategy, count in expected.items():
        assert runs[strategy]["distinct_blocks"] == count, strategy
        assert len(set(runs[strategy]["final_map"])) == count, strategy
    # Tying shares weights, gradients and Adam state: the live state is the analytic floor plus Adam's step counters.
    for strategy, run in runs.items():
        assert run["analytic_floor_bytes"] == 16 * run["trainable_parameters"], strategy
        assert run["analytic_floor_bytes"] <= run["state_bytes"]["total"] <= 1.001 * run["analytic_floor_bytes"], (
            strategy
        )
    assert runs["dlt"]["tying_decisions"] > 0 and runs["dlt"]["agent_overhead_share"] > 0
    assert runs["none"]["agent_overhead_share"] is None


@pytest.mark.slow
def test_memory_sweep_falls_with_fewer_distinct_blocks(tiny_bench):
    _, results = tiny_bench
    sweep = results["memory_sweep"]
    for depth in (24, 48):
        rows = [row for row in sweep if row["num_blocks"] == depth]
        assert [row["distinct_blocks"] for row in rows] == distinct_counts(depth)
        measured = [row["state_bytes"]["total"] for row in rows]
        assert measured == sorted(measured) and len(set(measured)) == len(measured)
        for row in rows:
            assert row["analytic_floor_bytes"] <= row["state_bytes"]["total"] <= 1.001 * row["analytic_floor_bytes"]


@pytest.mark.slow
def test_plots_are_written(tiny_bench):
    folder, _ = tiny_bench
    for name in ("perplexity_vs_trainable.png", "memory_vs_distinct.png"):
        image = matplotlib.image.imread(folder / name)
        assert image.shape[0] > 300 and image.shape[1] > 600, name
    assert (folder / "runs" / "dlt" / "tying_map.png").is_file()


@pytest.mark.slow
def test_a_missing_wikitext_file_is_named_in_the_table(tiny_bench):
    results = copy.deepcopy(tiny_bench[1])
    for run in results["runs"]:
        run.update(wikitext_perplexity=None, wikitext_missing="/nowhere/test.txt")
    report.add_ratios(results["runs"])
    table = report.markdown(results)
    assert "no file at /nowhere/test.txt" in table
    assert all(row.split(" | ")[6] == "missing" for row in table.splitlines() if row.startswith("| `"))


@given(st.integers(min_value=1, max_value=300))
def test_memory_sweep_distinct_counts_double_up_to_the_depth(depth):
    counts = distinct_counts(depth)
    assert counts[0] == 1 and counts[-1] == depth
    assert all(later == 2 * earlier for earlier, later in zip(counts[:-2], counts[1:-1], strict=True))
    assert counts == sorted(set(counts))


@pytest.mark.parametrize(
    "flags, named",
    [
        ({"n_embd": 30, "n_head": 4}, "--n_embd 30 must be divisible by --n_head 4"),
        ({"max_steps": 0}, "--max_steps"),
        ({"memory_depths": "24,x"}, "--memory_depths"),
        ({"epsilon_decay": 1.5}, "--epsilon_decay"),
    ],
)
def test_bad_flags_are_named(flags, named):
    with pytest.raises(ValueError, match=named):
        resolve_settings(BenchArguments(preset="tiny", **flags))
