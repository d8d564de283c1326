"""bench/run_bench.py: the tiny preset end to end, as a user types it (every strategy and seed, paired statistics,
budgets held, memory over depth, plots, resumption), and its argument checks."""

import ast
import dataclasses
import graphlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import matplotlib.image
import pytest
import torch
from scipy import stats
from tqdm.auto import tqdm

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # `bench` is a folder of the repository, not part of the installed package

from bench.provenance import processor_name  # noqa: E402
from bench.report import interval  # noqa: E402
from bench.run_bench import Scheduler  # noqa: E402
from bench.scheduling import Job, run_jobs, write_complete  # noqa: E402
from bench.settings import PRESETS, BenchArguments, RunSpec, measured_under, resolve_settings  # noqa: E402

# The fast tier (`python -m pytest -m "not e2e and not slow"`) leaves these out: bench's studies run end to end on tiny presets.
pytestmark = pytest.mark.e2e

TINY = PRESETS["tiny"]


def _bench(results: Path, *flags: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO_ROOT / "bench" / "run_bench.py"), "--preset", "tiny", "--results_dir", str(results)]
    return subprocess.run(command + list(flags), capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=900)


@pytest.fixture(scope="module")
def tiny_bench(tmp_path_factory):
    """One run of the whole tiny study, two runs side by side, shared by the tests of this file."""
    results = tmp_path_factory.mktemp("bench") / "tiny"
    completed = _bench(results, "--jobs", "2")
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return results, json.loads((results / "results.json").read_text())


@pytest.mark.slow
def test_every_strategy_has_every_seed_and_a_row(tiny_bench):
    folder, results = tiny_bench
    labels = {
        "none", "untied, 2 blocks", "dlt", "dlt (paper agent)", "random", "similarity", "dlt final map, from scratch",
        "random final map, from scratch", "similarity final map, from scratch",
        *(f"{layout} @ {budget} U" for layout in ("sequence", "cycle", "cycle_rev") for budget in ("final", "mean")),
    }  # fmt: skip
    assert set(results["runs"]) == labels
    for label in labels:
        assert sorted(map(int, results["runs"][label])) == list(TINY.seeds), label
        assert results["rows"][label]["seeds"] == list(TINY.seeds)
    table = (folder / "results.md").read_text()
    study_table = table.split("\n| strategy | seeds |")[1].split("\n\n")[0]  # not the memory table's rows
    assert all(study_table.count(f"\n| {label} | {len(TINY.seeds)} |") == 1 for label in labels)
    assert len(list(folder.glob("study/*/seed*/log.txt"))) >= 9 * len(TINY.seeds)  # each run its own process
    assert f"Hardware: {processor_name()}, 1 thread(s) per run." in table  # recorded by every run
    assert "| peak state MiB | peak RSS MiB |" in table
    assert "seeds; not shown to be within ±0.05 nats)" in table  # 2 seeds: t = 12.7, no interval is that narrow


@pytest.mark.slow
def test_a_report_written_by_a_lane_given_seeds_still_covers_every_seed(tiny_bench, tmp_path):
    """Two lanes split a study with `--seeds`: the report either writes covers the folder's runs of every seed."""
    folder, results = tiny_bench
    completed = _bench(folder, "--seeds", str(TINY.seeds[0]), "--report_only", "true", "--report_dir", str(tmp_path))
    assert completed.returncode == 0, completed.stderr[-3000:]
    lane = json.loads((tmp_path / "results.json").read_text())
    assert {label: row["seeds"] for label, row in lane["rows"].items()} == {label: row["seeds"] for label, row in results["rows"].items()}


@pytest.mark.slow
def test_runs_keep_their_budget_at_every_step(tiny_bench):
    _, results = tiny_bench
    for seed, dlt in results["runs"]["dlt"].items():
        assert dlt["tying_decisions"] >= TINY.max_steps // TINY.tying_interval - 1
        for label in ("dlt", "dlt (paper agent)", "random", "similarity"):
            assert results["runs"][label][seed]["distinct_final"] <= TINY.max_distinct_blocks, label
        for label in ("dlt", "dlt (paper agent)", "random"):
            assert results["runs"][label][seed]["distinct_peak"] <= TINY.max_distinct_blocks, label
        assert results["runs"]["none"][seed]["distinct_peak"] == TINY.n_layer
        for layout in ("sequence", "cycle", "cycle_rev"):
            assert results["runs"][f"{layout} @ final U"][seed]["distinct_peak"] == dlt["distinct_final"]
            assert results["runs"][f"{layout} @ mean U"][seed]["distinct_final"] == max(1, round(dlt["distinct_mean"]))
        assert results["runs"]["dlt final map, from scratch"][seed]["final_map"] == dlt["final_map"]
        assert results["runs"]["random final map, from scratch"][seed]["final_map"] == results["runs"]["random"][seed]["final_map"]
        # Similarity's map at the budget's memory from step 0 (similarity itself trains every block for its warm-up).
        similarity_map = results["runs"]["similarity final map, from scratch"][seed]
        assert similarity_map["final_map"] == results["runs"]["similarity"][seed]["final_map"]
        assert similarity_map["distinct_peak"] <= TINY.max_distinct_blocks
        # The equal-memory baseline: a model as shallow as the budget holds what a tied one at the budget holds.
        untied = results["runs"]["untied, 2 blocks"][seed]
        assert untied["num_blocks"] == untied["distinct_peak"] == TINY.max_distinct_blocks
        assert untied["peak_state_bytes"] < results["runs"]["none"][seed]["peak_state_bytes"]


@pytest.mark.slow
def test_runs_record_the_steps_their_map_moved(tiny_bench):
    _, results = tiny_bench
    for label, by_seed in results["runs"].items():
        for run in by_seed.values():
            steps = run["map_change_steps"]
            assert steps == sorted(set(steps)) and all(1 < step <= TINY.max_steps for step in steps), label
            if run["strategy"] == "none" or run["strategy"].startswith("static:"):
                assert steps == [], label  # a fixed map never moves
            if run["distinct_peak"] != run["distinct_final"]:  # e.g. similarity, untied for its warm-up
                assert steps, label


@pytest.mark.slow
def test_differences_are_paired_by_seed(tiny_bench):
    _, results = tiny_bench
    runs = results["runs"]
    differences = [runs["dlt"][seed]["test_loss"] - runs["none"][seed]["test_loss"] for seed in runs["dlt"]]
    reported = results["rows"]["dlt"]["versus"]["none"]
    assert reported["mean"] == pytest.approx(statistics.fmean(differences))
    assert reported["half_width"] == pytest.approx(interval(differences)[1])
    assert reported["verdict"] in ("no difference detected", "lower", "higher")
    assert "none" not in results["rows"]["none"]["versus"]


@pytest.mark.slow
def test_a_report_from_one_seed_and_no_fixed_layout_says_so(tiny_bench, tmp_path):
    """A long preset reported early: the first seed's runs, no fixed layout finished yet."""
    import dataclasses
    import shutil

    from bench.report import write_report

    folder, _ = tiny_bench
    partial = tmp_path / "partial"
    shutil.copytree(folder, partial)
    for layouts in (partial / "study").glob("static-*"):
        shutil.rmtree(layouts)
    settings = dataclasses.replace(resolve_settings(BenchArguments(preset="tiny")), seeds=(TINY.seeds[0],))
    report = write_report(settings, partial).read_text()
    assert "Best static layout at DLT's final budget (chosen on validation loss): none finished yet;" in report
    assert "- dlt vs none: " in report and "nats, 1 seed)" in report and "1 seeds" not in report


@pytest.mark.slow
def test_dlt_final_map_from_scratch_is_compared_with_dlt(tiny_bench):
    folder, results = tiny_bench
    runs = results["runs"]
    scratch = runs["dlt final map, from scratch"]
    differences = [scratch[seed]["test_loss"] - runs["dlt"][seed]["test_loss"] for seed in scratch]
    reported = results["rows"]["dlt final map, from scratch"]["versus"]["dlt"]
    assert reported["mean"] == pytest.approx(statistics.fmean(differences))
    assert reported["seeds"] == len(TINY.seeds)
    verdict = f"- dlt final map, from scratch vs dlt: {reported['verdict']} ({reported['mean']:+.3f} ± {reported['half_width']:.3f} nats"
    assert verdict in (folder / "results.md").read_text()


@pytest.mark.slow
def test_tying_lowers_the_peak_training_state_of_the_memory_runs_at_every_depth_with_and_without_checkpointing(tiny_bench):
    folder, results = tiny_bench
    memory = {(run["num_blocks"], run["strategy"], run["gradient_checkpointing"]): run for run in results["memory"]}
    assert len(memory) == len(results["memory"]) == 2 * (2 * len(TINY.memory_depths) + 1)  # each model in both modes
    for depth in TINY.memory_depths:
        for checkpointing in (False, True):
            none, dlt = memory[depth, "none", checkpointing], memory[depth, "dlt", checkpointing]
            assert dlt["distinct_peak"] <= TINY.memory_max_distinct_blocks < none["distinct_peak"] == depth
            assert dlt["peak_state_bytes"] < none["peak_state_bytes"]
            assert dlt["retie_ms"] > 0
            assert none["peak_process_bytes"] > 0 and none["peak_process_kind"] == "cpu_vm_hwm"
        # checkpointing keeps fewer activations, not less training state (the tiny runs' process peak is Python's)
        assert memory[depth, "none", True]["peak_state_bytes"] == memory[depth, "none", False]["peak_state_bytes"]
    summary = results["memory_summary"][f"dlt, {TINY.memory_depths[-1]} blocks"]
    assert summary["state_over_none"] < 1 and summary["state_over_none_checkpointing"] < 1
    assert "| untied, 2 blocks |" in (folder / "results.md").read_text()
    for name in ("quality_vs_distinct.png", "memory_vs_depth.png"):
        image = matplotlib.image.imread(folder / name)
        assert image.shape[0] > 300 and image.shape[1] > 600, name
    assert (folder / "study" / "dlt" / f"seed{TINY.seeds[0]}" / "tying_map.png").is_file()


@pytest.mark.slow
def test_a_rerun_skips_finished_runs_and_other_settings_are_refused(tiny_bench):
    folder, _ = tiny_bench
    results = sorted(folder.glob("**/result.json"))
    written = [path.stat().st_mtime_ns for path in results]
    rerun = _bench(folder)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert [path.stat().st_mtime_ns for path in results] == written
    other = _bench(folder, "--max_steps", "13")
    assert other.returncode != 0 and "holds runs measured with other settings" in other.stderr


@pytest.mark.slow
def test_a_forked_run_records_what_a_fresh_process_records(tiny_bench, tmp_path):
    """The tiny preset forks its runs from a template (`fork_runs`): the same run in a fresh process, as every other
    preset runs it, gives the same losses, maps and curve (nothing the template imported leaks into a run)."""
    folder, results = tiny_bench
    spec = RunSpec("dlt", "dlt", 0)  # the agent draws from the RNG too
    completed = _bench(tmp_path, "--single_run", spec.to_json())
    assert completed.returncode == 0, completed.stderr[-3000:]
    fresh = json.loads((tmp_path / spec.directory / "result.json").read_text())
    forked = results["runs"]["dlt"]["0"]
    for key in ("test_loss", "validation_curve", "final_map", "map_change_steps", "trained_steps"):
        assert fresh[key] == forked[key], key


@pytest.mark.slow
def test_every_record_says_which_code_and_versions_it_came_from(tiny_bench):
    folder, results = tiny_bench
    for label, runs in results["runs"].items():
        for run in runs.values():
            assert run["versions"]["torch"] and run["versions"]["transformers"], label
            # The commit, in a git checkout; a copy without .git (e.g. `git archive`) records None, not a guess.
            assert (run["commit"] is not None) == (REPO_ROOT / ".git").exists(), label
            assert run["final_test_loss"] == run["test_loss"] and run["learning_rate"] == TINY.learning_rate
    assert "Runs came from: commit " in (folder / "results.md").read_text()  # "commit None" outside git


def test_a_report_mixing_commits_says_which_runs_came_from_which():
    from bench.provenance import source_lines

    versions = {"torch": "2.13.0+cpu"}
    records = [
        {"label": "none", "seed": 0, "commit": "aaa", "versions": versions},
        {"label": "dlt", "seed": 0, "commit": "aaa", "versions": versions},
        {"label": "none", "seed": 1, "commit": "bbb", "versions": versions},
        {"label": "dlt", "seed": 1, "commit": "aaa", "versions": versions},
    ]
    assert source_lines(records[:2]) == ["", "Runs came from: commit aaa, torch 2.13.0+cpu"]
    assert source_lines(records) == [
        "", "Runs came from (MIXED: rerun the rows before comparing them, every run with torch 2.13.0+cpu):", "",
        "- commit aaa: none (0); dlt (0, 1)", "- commit bbb: none (1)",
    ]  # fmt: skip
    records.append({"label": "random", "seed": 0, "commit": "aaa", "versions": {"torch": "2.14.0+cpu"}})
    assert source_lines(records)[-1] == "- commit aaa, torch 2.14.0+cpu: random (0)"
    assert source_lines([]) == ["", "Runs came from: no run has finished yet."]


def test_a_report_names_the_losses_rescaled_after_they_were_measured():
    """Records carrying `CORRECTION_FIELD` (the loss-count migration of issue 49) are counted and named, with the
    factor and where the migration is kept."""
    from bench.provenance import CORRECTION_FIELD, source_lines

    correction = {CORRECTION_FIELD: {"factor": 64 / 63, "block_size": 64, "fixed_in": "41678c9"}}
    records = [
        {"label": "old", "seed": 0, "commit": "aaa", "versions": {}, **correction},
        {"label": "new", "seed": 0, "commit": "bbb", "versions": {}},
    ]
    lines = source_lines(records)
    assert "Losses of 1 of these 2 runs were measured before commit 41678c9" in lines[-1] and "64/63" in lines[-1]
    assert "git show 7372745:bench/correct_loss_count.py" in lines[-1]
    assert not any("Losses of" in line for line in source_lines(records[1:]))


def test_a_report_names_the_machines_its_runs_recorded_and_counts_each_run_once():
    from bench.provenance import hardware
    from bench.report import _distinct_runs

    gpu = {"label": "none", "seed": 0, "learning_rate": 1e-3, "hardware": "NVIDIA H100 80GB HBM3"}
    cpu = {"label": "dlt", "seed": 0, "learning_rate": 1e-3, "hardware": "AMD EPYC, 1 thread(s) per run"}
    old = {"label": "dlt", "seed": 1, "learning_rate": 1e-3}
    # `random final map` reuses dlt's seed-0 run (the same map) but has a run of its own in seed 1.
    table = {"none": {0: gpu}, "dlt": {0: cpu, 1: old}, "random final map": {0: dict(cpu), 1: {**old, "label": "random final map"}}}
    runs = _distinct_runs(table)
    assert len(runs) == 4
    assert hardware(runs[:2]) == "AMD EPYC, 1 thread(s) per run; NVIDIA H100 80GB HBM3"
    described = hardware(runs)
    assert described.startswith("AMD EPYC, 1 thread(s) per run; NVIDIA H100 80GB HBM3 and 2 run(s) from before runs recorded")
    assert f"(this report was written on {processor_name()})" in described and processor_name()


@pytest.mark.slow
def test_every_run_reports_the_test_loss_at_its_best_validation_step_and_the_report_pairs_it(tiny_bench):
    folder, results = tiny_bench
    runs = results["runs"]
    for label, by_seed in runs.items():
        for run in by_seed.values():
            curve = run["validation_curve"]
            assert [point["step"] for point in curve] == list(range(TINY.eval_interval, TINY.max_steps + 1, TINY.eval_interval))
            best = min(curve, key=lambda point: point["validation_loss"])
            assert (run["best_validation_step"], run["test_loss_at_best_validation"]) == (best["step"], best["test_loss"]), label
            assert curve[-1]["test_loss"] == run["final_test_loss"] == run["test_loss"], label
    # The paper's model selection, paired like the last step's losses, in the table and the verdicts.
    differences = [runs["dlt"][seed]["test_loss_at_best_validation"] - runs["none"][seed]["test_loss_at_best_validation"] for seed in runs["dlt"]]
    reported = results["rows"]["dlt"]["selected"]["versus"]["none"]
    assert reported["mean"] == pytest.approx(statistics.fmean(differences))
    table = (folder / "results.md").read_text()
    verdicts = table.split("Paired verdicts at each run's best-validation step (the paper's model selection):")[1]
    assert f"- dlt vs none: {reported['verdict']} ({reported['mean']:+.3f} ± {reported['half_width']:.3f} nats" in verdicts
    assert "- untied, 2 blocks vs none: " in verdicts  # the equal-memory model against full depth
    assert "| strategy | test loss at best validation | best / last step (mean) |" in table
    image = matplotlib.image.imread(folder / "validation_over_steps.png")
    assert image.shape[0] > 300 and image.shape[1] > 1200  # the curves beside the selected-vs-last comparison


def test_a_run_with_early_stopping_stops_once_its_validation_loss_has_not_fallen_for_patience_evaluations(tmp_path):
    from bench.measure import run

    patience = 2  # a high learning rate, so that the validation loss soon stops falling
    settings = dataclasses.replace(TINY, max_steps=60, eval_interval=2, early_stopping_patience=patience, learning_rate=0.3)
    result = run(settings, RunSpec("none", "none", 0), tmp_path)
    curve = [point["validation_loss"] for point in result["validation_curve"]]
    assert result["trained_steps"] == result["validation_curve"][-1]["step"] < settings.max_steps
    assert len(curve) == result["trained_steps"] // settings.eval_interval
    # It stopped at the first evaluation that made `patience` in a row without a new lowest validation loss.
    without_new_low = [all(curve[j] >= min(curve[:j]) for j in range(i - patience + 1, i + 1)) for i in range(patience, len(curve))]
    assert without_new_low[-1] and not any(without_new_low[:-1])
    assert result["best_validation_step"] == settings.eval_interval * (1 + curve.index(min(curve)))


def test_a_study_run_can_train_a_looped_model_with_every_loop_setting(tmp_path, monkeypatch):
    """Looped models, part 2 measures part 1's settings through the study's runs: the trainer's (`tying`) and the
    model's (`looped_config`), each in the run's folder name and its record."""
    from bench import measure

    spec = RunSpec(
        "cycle @ U, recipe", "static:cycle:2", 0,
        tying=(("loop_onset", 0.5), ("loop_schedule", "progressive"), ("loop_lr_exponent", 1.0)),
        looped_config=(("loop_residual_scale", True), ("loop_input_injection", True)),
    )  # fmt: skip
    assert spec.directory.endswith("-loop_lr_exponent=1.0-loop_residual_scale=True-loop_input_injection=True/seed0")
    assert RunSpec.from_json(spec.to_json()) == spec
    built, build_model = [], measure.build_model
    monkeypatch.setattr(measure, "build_model", lambda *args: built.append(build_model(*args)) or built[-1])
    result = measure.run(TINY, spec, tmp_path)
    assert result["trained_steps"] == TINY.max_steps
    assert result["tying_settings"] == dict(spec.tying) and result["looped_config"] == dict(spec.looped_config)
    config = built[0].config
    assert config.loop_residual_scale and config.loop_input_injection and config.skipped_positions is None  # loops on


def test_a_run_records_each_distinct_blocks_gradient_norm_and_the_log_at_its_interval_under_its_recipe(tmp_path):
    """Issue 53, part 2's measurements: a looped model (4 positions on 2 blocks) under a recipe other than the
    study's; the groups' norms add up to the whole gradient's, and the log gives the norm before clipping."""
    from bench.measure import run

    interval = 4
    settings = dataclasses.replace(TINY, lr_scheduler_type="linear", weight_decay=0.01, gradient_norm_interval=interval)
    result = run(settings, RunSpec("cycle @ U", "static:cycle:2", 0), tmp_path)
    norms, log = result["gradient_norms"], result["training_log"]
    assert [row["step"] for row in norms] == [row["step"] for row in log] == list(range(interval, TINY.max_steps + 1, interval))
    for row, logged in zip(norms, log):
        assert {owner: block["positions"] for owner, block in row["blocks"].items()} == {"0": 2, "1": 2}
        parts = math.sqrt(sum(block["norm"] ** 2 for block in row["blocks"].values()) + row["other"] ** 2)
        assert parts == pytest.approx(row["clipped_total"], rel=1e-5)
        assert row["clipped_total"] == pytest.approx(min(logged["grad_norm"], 1.0), rel=1e-4)  # clipped at max_grad_norm
    # linear decay from the peak rate (no warm-up in tiny) to zero at the last step
    assert log[0]["learning_rate"] == pytest.approx(TINY.learning_rate * (1 - (interval - 1) / TINY.max_steps))


@pytest.mark.slow
def test_a_study_on_a_task_reports_accuracy_per_hop_count_for_every_strategy(tmp_path):
    task = "hop_induction:length=16,max_hops=2,train_examples=200,eval_examples=40"
    completed = _bench(tmp_path, "--task", task, "--block_size", "18", "--seeds", "0", "--skip_memory", "true", "--jobs", "2")
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert {"cycle @ U", "sequence @ U", "cycle_rev @ U", "untied, 2 blocks", "dlt"} <= results["runs"].keys()
    for label, runs in results["runs"].items():
        (run,) = runs.values()
        assert run["accuracy_by_hops"].keys() == {"1", "2"}, label
        assert run["mean_accuracy"] == pytest.approx(statistics.fmean(run["accuracy_by_hops"].values()))
    assert results["runs"]["cycle @ U"]["0"]["final_map"] == [0, 1, 0, 1]
    table = (tmp_path / "results.md").read_text()
    assert "| strategy | 1 hops | 2 hops | mean |" in table and "Count bigram" not in table
    assert "- dlt vs untied U: one seed: no interval yet" in table and "; accuracy: one seed: no interval yet" in table
    for picture in ("accuracy_by_hops.png", "accuracy_by_seed.png"):
        assert matplotlib.image.imread(tmp_path / picture).shape[0] > 100, picture


def test_the_fresh_seed_preset_runs_the_recipe_rows_with_dlt_and_random_under_the_frozen_choice_only(tmp_path, monkeypatch):
    """Issue 53, part 2: seeds 5-14; the recipe rows, DLT and random, the agents without followers; the schedule and
    weight decay of bench/recipe_report.py's choice, refused while that choice is provisional, frozen once the
    results folder is claimed, and never taken from flags."""
    import bench.settings as bench_settings
    from bench.run_bench import claim_results_dir
    from bench.settings import freeze_recipe, independent_runs, recipe_runs, runs_after

    report, output = tmp_path / "results.json", tmp_path / "fresh"
    monkeypatch.setattr(bench_settings, "RECIPE_REPORT", report)
    args = BenchArguments(preset="depth-fresh", results_dir=str(output))
    resolved = resolve_settings(args)
    with pytest.raises(ValueError, match=r"results.json: no recipe choice to freeze there"):
        freeze_recipe(resolved, args, output)
    linear = {"name": "linear, weight decay 0.01", "lr_scheduler_type": "linear", "weight_decay": 0.01, "folder": "x"}
    payload = {"recipes": {linear["name"]: linear}, "choice": {"recipe": linear["name"], "pairs": 3, "complete": False}}
    report.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match=r"the recipe choice in .*results.json is provisional: 3 \(row, seed\) pairs"):
        freeze_recipe(resolved, args, output)
    with pytest.raises(ValueError, match="--weight_decay: preset depth-fresh trains under the recipe chosen on seeds 0-4"):
        freeze_recipe(resolved, BenchArguments(preset="depth-fresh", weight_decay=0.1), output)
    report.write_text(json.dumps(payload | {"choice": payload["choice"] | {"complete": True}}))
    settings = freeze_recipe(resolved, args, output)
    assert (settings.lr_scheduler_type, settings.weight_decay, settings.seeds) == ("linear", 0.01, tuple(range(5, 15)))
    assert dataclasses.replace(settings, lr_scheduler_type="cosine", weight_decay=0.1, seeds=PRESETS["recipe"].seeds,
                               recipe_agents=False, frozen_recipe=False, gradient_norm_interval=25) == PRESETS["recipe"]  # fmt: skip
    # Claimed, the folder keeps its recipe whatever the report chooses later (its child runs resolve it again).
    (output / "settings.json").parent.mkdir()
    (output / "settings.json").write_text(json.dumps({"fingerprint": settings.fingerprint(), "baselines": {}}))
    report.write_text(json.dumps(payload))  # provisional again, e.g. a recipe added to the grid
    assert freeze_recipe(resolved, args, output) == settings
    claim_results_dir(output, freeze_recipe(resolved, args, output))  # the same fingerprint: accepted
    planned = independent_runs(settings, 5)
    assert [spec.label for spec in planned] == [spec.label for spec in recipe_runs(settings, 5)] + ["dlt", "random"]
    finished = {"final_map": [0, 1, 1, 1], "distinct_final": 2, "distinct_mean": 1.5}
    assert [runs_after(spec, finished, settings) for spec in planned[-2:]] == [[], []]
    assert runs_after(planned[-1], finished, PRESETS["depth"])  # the depth study's random has its follower


def test_the_k_hop_partial_preset_loops_3_blocks_under_the_frozen_recipe(tmp_path, monkeypatch):
    """Issue 53, part 1 on k-hop induction: 3 untied blocks against the same 3 looped over 4, 5 and 6 positions, on
    depth's task and steps, under the recipe chosen on seeds 0-4 and refused before that choice is final."""
    import bench.settings as bench_settings
    from bench.settings import freeze_recipe, independent_runs

    report, output = tmp_path / "results.json", tmp_path / "partial-depth"
    monkeypatch.setattr(bench_settings, "RECIPE_REPORT", report)
    args = BenchArguments(preset="partial-depth", results_dir=str(output))
    with pytest.raises(ValueError, match=r"results.json: no recipe choice to freeze there"):
        freeze_recipe(resolve_settings(args), args, output)
    cosine = {"name": "cosine, weight decay 0.01", "lr_scheduler_type": "cosine", "weight_decay": 0.01, "folder": "x"}
    report.write_text(json.dumps({"recipes": {cosine["name"]: cosine}, "choice": {"recipe": cosine["name"], "pairs": 10, "complete": True}}))
    settings = freeze_recipe(resolve_settings(args), args, output)
    assert (settings.lr_scheduler_type, settings.weight_decay, settings.seeds) == ("cosine", 0.01, (5, 6, 7, 8, 9))
    assert (settings.task, settings.max_steps, settings.n_embd) == (PRESETS["depth"].task, PRESETS["depth"].max_steps, PRESETS["depth"].n_embd)
    planned = {spec.label: (spec.strategy, spec.num_blocks) for spec in independent_runs(settings, 5)}
    assert planned["untied, 3 blocks"] == ("none", 3)
    assert planned["loop middle, 4 positions (0 1 1 3)"] == ("static:0,1,1,3", 4)
    assert sorted(blocks for _, blocks in planned.values()) == [3, 4, 4, 4, 5, 5, 5, 6, 6, 6]


@pytest.mark.slow
def test_a_fresh_seed_report_pairs_dlt_with_the_best_layout_at_the_budget(tmp_path):
    """Without DLT's followers (preset depth-fresh), the best static layout is chosen on validation loss among the
    layouts at the budget itself, and DLT and random are paired with it and with the untied blocks."""
    from bench.measure import run
    from bench.report import write_report
    from bench.settings import independent_runs

    settings = dataclasses.replace(
        PRESETS["depth-fresh"], task="hop_induction:length=16,max_hops=2,train_examples=200,eval_examples=40",
        n_embd=32, n_head=2, block_size=18, max_steps=2, batch_size=2, warmup_steps=0, seeds=(5, 6),
    )  # fmt: skip
    trained = run(settings, RunSpec("dlt", "dlt", 5), tmp_path / "run")
    (tmp_path / "settings.json").write_text(json.dumps({"fingerprint": settings.fingerprint(), "baselines": {"bigram_test_loss": None}}))
    validation = {"cycle @ U": 0.5, "sequence @ U": 0.3, "cycle_rev @ U": 0.4}
    for seed in settings.seeds:
        for index, spec in enumerate(independent_runs(settings, seed)):
            (tmp_path / spec.directory).mkdir(parents=True)
            losses = {"validation_loss": validation.get(spec.label, 1.0), "test_loss": 1 + index / 10 + seed / 100}
            distinct = 1 if (spec.label, seed) == ("random", 6) else 2  # random ended below the budget in seed 6
            record = {"label": spec.label, "seed": seed, "num_blocks": spec.num_blocks or settings.n_layer, "distinct_final": distinct, **losses}
            write_complete(tmp_path / spec.directory / "result.json", trained | record)
    report = write_report(settings, tmp_path).read_text()
    payload = json.loads((tmp_path / "results.json").read_text())
    assert payload["best_static_at_final_budget"] == "sequence @ U"
    rows = payload["rows"]
    labels = [spec.label for spec in independent_runs(settings, 5)]
    dlt_minus = labels.index("dlt") - labels.index("sequence @ U")
    assert rows["dlt"]["versus"]["best static"]["mean"] == pytest.approx(dlt_minus / 10)
    assert "untied U" in rows["random"]["versus"] and "best static" not in rows["random"]["versus"]  # not at its budget
    assert "Best static layout at the budget (chosen on validation loss): sequence @ U;" in report
    assert "- random vs untied U: " in report and "- 0 1 1 1 vs untied U: " in report


def test_the_selected_model_is_compared_with_the_best_layout_only_at_the_budget_it_had():
    """Under the paper's model selection a moving map's model is judged at its best-validation step, where it may
    have had fewer distinct blocks than at the end: its comparison with the best static layout is at that step's
    budget, not the final one's."""
    from bench.report import summarise

    def record(seed: int, distinct_final: int, distinct_selected: int | None) -> dict:
        selected = {} if distinct_selected is None else {"distinct_at_best_validation": distinct_selected}
        curve = [{"step": 10, "validation_loss": 1.0, "test_loss": 1.0 + seed / 10}]
        return {
            "seed": seed, "test_loss": 1.0, "validation_loss": 1.0, "distinct_final": distinct_final, "distinct_mean": 2, "distinct_peak": 2,
            "peak_state_bytes": 1, "peak_process_bytes": 1, "train_seconds": 1, "num_blocks": 4, "tying_seconds": {},
            "validation_curve": curve, "test_loss_at_best_validation": curve[0]["test_loss"], "best_validation_step": 10, **selected,
        }  # fmt: skip

    layout = {seed: record(seed, 2, 2) for seed in (0, 1)}
    for selected_blocks, compared in ((2, True), (1, False)):  # at the end both had 2; selected, seed 1 had 1 or 2
        table = {"sequence @ U": layout, "dlt": {0: record(0, 2, 2), 1: record(1, 2, selected_blocks)}}
        row = summarise(table, {}, ["sequence @ U"])["rows"]["dlt"]
        assert "best static" in row["versus"]  # the last step's models: same budget
        assert ("best static" in row["selected"]["versus"]) is compared
        assert row["selected"]["budget_checked_at"] == "selected step"
    before = {"sequence @ U": layout, "dlt": {seed: record(seed, 2, None) for seed in (0, 1)}}  # records before the field
    assert summarise(before, {}, ["sequence @ U"])["rows"]["dlt"]["selected"]["budget_checked_at"] == "final map"


def test_model_selection_records_the_distinct_blocks_of_the_map_each_evaluation_judged():
    """The Trainer evaluates after a step's `on_step_end`, where `RunMeter` counted that step's map."""
    from bench.measure import model_selection

    log = [{"step": 2, "eval_validation_loss": 3.0}, {"step": 2, "eval_test_loss": 3.1}, {"step": 4, "eval_validation_loss": 2.0}, {"step": 4, "eval_test_loss": 2.1}]  # fmt: skip
    selected = model_selection(log, 6, {"validation_loss": 2.5, "test_loss": 2.6}, distinct_per_step=[4, 4, 3, 2, 2, 3])
    assert [(point["step"], point["distinct_blocks"]) for point in selected["validation_curve"]] == [(2, 4), (4, 2), (6, 3)]
    assert (selected["best_validation_step"], selected["distinct_at_best_validation"], selected["test_loss_at_best_validation"]) == (4, 2, 2.1)


PARTIAL_LOOPS = {  # issue 53: 4 untied blocks, and the same 4 looped over 5, 6 and 8 positions
    "untied, 4 blocks": ("none", 4),
    "loop middle, 5 positions (0 1 1 3 4)": ("static:0,1,1,3,4", 5),
    "loop start, 5 positions (0 0 2 3 4)": ("static:0,0,2,3,4", 5),
    "loop end, 5 positions (0 1 2 3 3)": ("static:0,1,2,3,3", 5),
    "loop middle, 6 positions (0 1 2 1 2 5)": ("static:0,1,2,1,2,5", 6),
    "loop start, 6 positions (0 1 0 1 4 5)": ("static:0,1,0,1,4,5", 6),
    "loop end, 6 positions (0 1 2 3 2 3)": ("static:0,1,2,3,2,3", 6),
    "loop middle, 8 positions (0 1 2 1 2 1 2 7)": ("static:0,1,2,1,2,1,2,7", 8),
    "loop start, 8 positions (0 1 0 1 0 1 6 7)": ("static:0,1,0,1,0,1,6,7", 8),
    "loop end, 8 positions (0 1 2 3 2 3 2 3)": ("static:0,1,2,3,2,3,2,3", 8),
}


def test_a_folder_is_measured_under_its_own_settings_only(tmp_path):
    """`measured_under`, which every script asks before it adds runs to a folder or reads them as a preset's: a
    folder's settings.json names the settings its runs were measured under, and no others; no settings.json, no runs."""
    default = REPO_ROOT / "bench" / "results" / "default"
    assert measured_under(default, PRESETS["default"])
    assert not measured_under(default, PRESETS["tiny"])
    assert not measured_under(default, dataclasses.replace(PRESETS["default"], n_embd=PRESETS["default"].n_embd * 2))
    assert not measured_under(tmp_path, PRESETS["default"])


def test_memory_runs_with_gradient_checkpointing_get_folders_of_their_own_and_earlier_runs_keep_theirs():
    """Checkpointed memory runs are runs of their own (folder, record), so that a folder recorded before the setting
    existed keeps its fingerprint and its runs, and reads as runs without checkpointing."""
    from bench.report import memory_summary
    from bench.settings import memory_runs

    default = PRESETS["default"]
    recorded = json.loads((REPO_ROOT / "bench" / "results" / "default" / "settings.json").read_text())["fingerprint"]
    assert default.fingerprint() == recorded == dataclasses.replace(default, memory_gradient_checkpointing=(True,)).fingerprint()
    # The same for compress's later fields (`COMPRESS_LATER_SETTINGS`): its committed folders keep their runs.
    from bench.compress_settings import PRESETS as COMPRESS_PRESETS

    for name in ("default", "depth"):
        assert measured_under(REPO_ROOT / "bench" / "results" / f"compress-{name}", COMPRESS_PRESETS[name]), name
    folders = [spec.directory for spec in memory_runs(default)]
    assert folders[:7] == [f"memory/L{depth}/{strategy}/seed0" for depth in (12, 24, 48) for strategy in ("none", "dlt")] + ["memory/L8/none/seed0"]
    assert folders[7:] == [folder.replace("/seed0", "-checkpointing/seed0") for folder in folders[:7]]

    def record(strategy: str, blocks: int, state: int, peak: int, **checkpointing: bool) -> dict:
        return dict(strategy=strategy, num_blocks=blocks, peak_state_bytes=state, peak_process_bytes=peak, distinct_peak=8, retie_ms=1.0, **checkpointing)

    earlier = [record("none", 48, 40, 100), record("dlt", 48, 10, 80), record("none", 8, 10, 30)]  # no field: without
    later = [record("none", 48, 40, 50, gradient_checkpointing=True), record("dlt", 48, 10, 40, gradient_checkpointing=True)]
    summary = memory_summary(dataclasses.replace(default, memory_depths=(48,)), earlier + later)
    assert list(summary) == ["none, 48 blocks", "dlt, 48 blocks", "untied, 8 blocks"]
    assert summary["dlt, 48 blocks"]["process_over_none"] == 0.8 and summary["dlt, 48 blocks"]["process_over_none_checkpointing"] == 0.8
    assert summary["dlt, 48 blocks"]["process_checkpointing_over_without"] == 0.5
    assert summary["untied, 8 blocks"]["process_over_none"] == 0.3 and "peak_process_mib_checkpointing" not in summary["untied, 8 blocks"]
    assert "state_over_none" not in summary["none, 48 blocks"]  # not itself over itself
    assert resolve_settings(BenchArguments(memory_gradient_checkpointing="True")).memory_gradient_checkpointing == (True,)


def test_presets_are_read_from_their_files_with_bases_resolved_and_a_bad_file_is_named(tmp_path):
    """A preset is a JSON file (bench/presets/<tool>/<name>.json) holding the fields it sets and, when derived, the
    preset it starts from: the study's committed folders keep their fingerprints (test above), a derived preset is its
    base with its own fields, and a file naming an unknown setting or base fails with one error naming the file."""
    from bench.settings import PRESETS_DIR, preset_files, read_presets

    for name, document in preset_files(PRESETS_DIR / "study").items():
        assert document["help"] and document["why"], name
        if "base" in document:
            base = dataclasses.replace(PRESETS[document["base"]], **{key: tuple(value) if isinstance(value, list) else value for key, value in document["settings"].items()})
            assert base == PRESETS[name], name
    assert PRESETS["loops-hop"].seeds == () and PRESETS["depth"].memory_depths == (12, 24, 48)  # lists read as tuples
    bad = {"help": "h", "why": "w", "settings": {"n_layers": 4}}
    (tmp_path / "tiny.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"tiny\.json: .*n_layers"):
        read_presets(tmp_path, type(TINY))
    (tmp_path / "tiny.json").write_text(json.dumps(bad | {"base": "nowhere", "settings": {}}))
    with pytest.raises(ValueError, match=r"tiny\.json: base 'nowhere'"):
        read_presets(tmp_path, type(TINY))


def test_the_partial_preset_loops_4_blocks_in_the_middle_at_the_start_and_at_the_end():
    from bench.settings import core_runs, independent_runs, memory_runs
    from hf_layertie import TyingMap

    settings = PRESETS["partial"]
    default = dict(n_layer=12, controls=True, partial_loops=False, seeds=tuple(range(10)), tuning_seed=None)
    assert dataclasses.replace(settings, **default) == PRESETS["default"]
    assert {spec.label: (spec.strategy, spec.num_blocks) for spec in independent_runs(settings, 3)} == PARTIAL_LOOPS
    assert core_runs(settings, 0) == independent_runs(settings, 0) and memory_runs(settings) == []  # tuned: every row
    for strategy, positions in list(PARTIAL_LOOPS.values())[1:]:
        entries = [int(entry) for entry in strategy.removeprefix("static:").split(",")]
        assert TyingMap(entries).to_list() == entries and len(entries) == positions  # canonical, at its depth
        assert TyingMap(entries).num_distinct == 4  # equal parameters and training state


@pytest.mark.slow
def test_a_partial_study_trains_each_loop_at_its_depth_and_reports_it_against_untied_blocks(tmp_path):
    """One loop trained at a tiny size; the report from its record under every row and two seeds (no agent, no
    memory runs): paired with the untied blocks, and the middle loops with the same loops at the start and end."""
    from bench.measure import run
    from bench.report import write_report
    from bench.settings import independent_runs

    settings = dataclasses.replace(
        PRESETS["partial"], n_embd=32, n_head=2, block_size=32, max_steps=2, batch_size=2, warmup_steps=0,
        max_test_blocks=8, max_validation_blocks=8, seeds=(0, 1),
    )  # fmt: skip
    looped = run(settings, independent_runs(settings, 0)[7], tmp_path / "run")
    assert (looped["final_map"], looped["num_blocks"], looped["distinct_peak"]) == ([0, 1, 2, 1, 2, 1, 2, 7], 8, 4)
    (tmp_path / "settings.json").write_text(json.dumps({"fingerprint": settings.fingerprint(), "baselines": {"bigram_test_loss": None}}))
    for seed in settings.seeds:
        for index, spec in enumerate(independent_runs(settings, seed)):
            (tmp_path / spec.directory).mkdir(parents=True)
            record = {"label": spec.label, "seed": seed, "num_blocks": spec.num_blocks, "test_loss": 5 + index * (1 + seed) / 100}
            write_complete(tmp_path / spec.directory / "result.json", looped | record)
    report = write_report(settings, tmp_path).read_text()
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    middle = rows["loop middle, 6 positions (0 1 2 1 2 5)"]
    assert middle["versus"]["untied U"]["mean"] == pytest.approx(0.06)  # index 4 against 0, paired: 0.04, 0.08
    assert middle["versus"]["loop at start"]["mean"] == pytest.approx(-0.015)
    assert middle["seconds_per_step"] == pytest.approx(looped["train_seconds"] / looped["trained_steps"])
    assert "loop at start" not in rows["loop start, 6 positions (0 1 0 1 4 5)"]["versus"]
    assert all(f"\n| {label} | 2 | " in report for label in PARTIAL_LOOPS)
    assert "- loop middle, 8 positions (0 1 2 1 2 1 2 7) vs the same loop at the end: " in report
    assert "- loop end, 5 positions (0 1 2 3 3) vs untied, 4 blocks: no difference detected (+0.045 ± " in report


@pytest.mark.slow
def test_a_partial_study_on_a_task_pairs_each_loop_s_accuracy_as_its_loss(tmp_path):
    """Preset partial-depth's report: the task named, not the plays, and each loop's mean accuracy paired with the
    untied blocks and, in the middle, with the same loop at the start and at the end, as its loss is."""
    from bench.measure import run
    from bench.report import write_report
    from bench.settings import independent_runs

    task = "hop_induction:length=16,max_hops=2,train_examples=200,eval_examples=40"
    settings = dataclasses.replace(
        PRESETS["partial-depth"], task=task, block_size=18, n_embd=32, n_head=2, max_steps=2, batch_size=2, warmup_steps=0, seeds=(5, 6)
    )  # fmt: skip
    looped = run(settings, independent_runs(settings, 5)[1], tmp_path / "run")
    (tmp_path / "settings.json").write_text(json.dumps({"fingerprint": settings.fingerprint(), "baselines": {"bigram_test_loss": None}}))
    for seed in settings.seeds:
        for index, spec in enumerate(independent_runs(settings, seed)):
            (tmp_path / spec.directory).mkdir(parents=True)
            record = {"label": spec.label, "seed": seed, "num_blocks": spec.num_blocks, "mean_accuracy": 0.5 + index * seed / 100}
            write_complete(tmp_path / spec.directory / "result.json", looped | record)
    report = write_report(settings, tmp_path).read_text()
    middle = json.loads((tmp_path / "results.json").read_text())["rows"]["loop middle, 4 positions (0 1 1 3)"]["accuracy"]["versus"]
    assert middle["untied U"]["mean"] == pytest.approx(0.055)  # index 1 against 0, paired: 0.05, 0.06
    assert middle["loop at start"]["mean"] == pytest.approx(-0.055) and middle["loop at end"]["mean"] == pytest.approx(-0.11)
    assert f"task `{task}`" in report and "held-out plays" not in report
    assert "| layout | 1 hops | 2 hops | mean | vs untied U | vs the loop at the start | vs the loop at the end |" in report
    assert "- loop middle, 4 positions (0 1 1 3) vs the same loop at the end: " in report and "; accuracy: " in report


def test_a_study_stopped_early_has_its_equal_memory_contrasts_over_every_seed_first(tmp_path):
    """Every seed's equal-memory runs (and DLT's followers, before the next seed's) come before any seed's other
    strategies, and those before any control: the runs a long preset finishes first are its first question's."""
    settings = dataclasses.replace(TINY, seeds=(0, 1), controls=True)
    dlt = RunSpec("dlt", "dlt", 0)
    (tmp_path / dlt.directory).mkdir(parents=True)
    write_complete(tmp_path / dlt.directory / "result.json", {"final_map": [0, 0, 2, 2], "distinct_final": 2, "distinct_mean": 1.6})
    scheduler = Scheduler(settings, tmp_path, jobs=1, with_memory=False)
    scheduler.progress = tqdm(disable=True, total=len(scheduler.queue))
    started = []
    while (job := scheduler._next_job()) is not None:
        started.append((job.payload[1].label, job.payload[1].seed))
    assert started[:9] == [
        ("none", 0), ("untied, 2 blocks", 0),
        ("sequence @ final U", 0), ("cycle @ final U", 0), ("cycle_rev @ final U", 0),  # mean U rounds to 2: same runs
        ("dlt final map, from scratch", 0),
        ("none", 1), ("untied, 2 blocks", 1), ("dlt", 1),
    ]  # fmt: skip
    assert [label for label, _ in started[9:15]] == ["dlt (paper agent)", "random", "similarity"] * 2
    assert [seed for _, seed in started[9:15]] == [0, 0, 0, 1, 1, 1]
    assert all(label.startswith("dlt") and label != "dlt" for label, _ in started[15:]) and len(started) == 15 + 2 * 5


def test_a_resumed_study_counts_only_the_runs_it_trains_in_its_progress(tmp_path):
    """Runs an earlier invocation finished leave the bar's total instead of counting as done in no time, which would
    make the rate and the time left a fraction of the truth."""
    settings = dataclasses.replace(TINY, seeds=(0,))
    scheduler = Scheduler(settings, tmp_path, jobs=1, with_memory=False)
    queued = len(scheduler.queue)
    finished = scheduler.queue[0][1]  # conventional training: no runs follow it
    (tmp_path / finished.directory).mkdir(parents=True)
    write_complete(tmp_path / finished.directory / "result.json", {"test_loss": 4.0})
    scheduler.progress = tqdm(disable=True, total=queued)
    job = scheduler._next_job()
    assert job.payload[1] != finished and scheduler.progress.n == 0
    assert finished.label == "none" and scheduler.progress.total == queued - 1 and scheduler.finished_before == 1


def test_interval_is_the_student_t_interval():
    mean, half = interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(stats.t.ppf(0.975, 2) / math.sqrt(3))
    assert math.isnan(interval([1.0])[1])


def test_a_diverged_run_is_reported_as_such_and_never_chosen_as_the_best():
    """A run whose loss became nan or inf: the report is still written, its cells say so, and it ranks last."""
    from bench.report import _lowest, paired_difference, verdict_cell

    trained = {0: {"test_loss": 4.1, "validation_loss": 4.1}, 1: {"test_loss": 4.2, "validation_loss": 4.2}}
    for value in (math.nan, math.inf):
        diverged = {0: {"test_loss": value, "validation_loss": value}, 1: {"test_loss": 4.0, "validation_loss": 4.0}}
        difference = paired_difference(diverged, trained)
        assert not math.isfinite(difference["mean"]) and verdict_cell(difference).endswith("(not finite: a run diverged)")
        table = {"diverged": diverged, "trained": trained}
        assert _lowest(["diverged", "trained"], table, lambda run: run["validation_loss"]) == "trained"


def test_a_difference_over_fewer_seeds_than_its_rows_says_so():
    """A row's loss is over its own seeds, a difference over those both rows have: the cell names the gap."""
    from bench.markdown_tables import format_value
    from bench.report import row_difference, verdict_cell

    longer = {seed: {"test_loss": 4.0 + seed / 10} for seed in range(3)}
    shifted = {seed: {"test_loss": 4.1} for seed in range(1, 5)}  # seeds 1-4: shares 1 and 2, and has 3 and 4 of its own
    difference = row_difference(longer, shifted)
    assert difference["seeds"] == 2 and difference["mean"] == pytest.approx(0.05)
    assert verdict_cell(difference).endswith("[paired on 2 seeds; absent from the other row on 1]")  # seed 0
    assert format_value(difference, "difference").endswith("[paired on 2 seeds; absent from the other row on 1]")
    assert row_difference(shifted, longer)["left_out"] == 2  # seeds 3 and 4
    assert "left_out" not in row_difference({seed: longer[seed] for seed in range(2)}, longer)  # all of the row's paired


def test_no_difference_gets_a_size_from_an_equivalence_test_on_losses_only():
    from bench.report import paired_difference

    def runs(offset, deltas):
        return {seed: {"test_loss": 4.0 + offset + delta, "mean_accuracy": 0.5 + delta} for seed, delta in enumerate(deltas)}

    baseline = runs(0.0, [0.0] * 5)
    spread = [0.01, -0.01, 0.0, 0.005, -0.005]  # 90% half-width 0.0075
    assert paired_difference(runs(0.0, spread), baseline)["equivalent_within_margin"] is True
    assert paired_difference(runs(0.045, spread), baseline)["equivalent_within_margin"] is False  # 0.045 + 0.0075 > 0.05
    assert paired_difference(runs(-0.045, spread), baseline)["equivalent_within_margin"] is False  # and below -0.05
    wide = paired_difference(runs(0.0, [0.08, -0.08, 0.0, 0.04, -0.04]), baseline)  # 90% half-width 0.060
    assert wide["verdict"] == "no difference detected" and wide["equivalent_within_margin"] is False
    assert "equivalent_within_margin" not in paired_difference(runs(0.0, spread), baseline, key="mean_accuracy")
    assert "equivalent_within_margin" not in paired_difference({0: baseline[0]}, baseline)


@pytest.mark.parametrize(
    "flags, named",
    [
        ({"n_embd": 30, "n_head": 4}, "--n_embd 30 must be divisible by --n_head 4"),
        ({"max_steps": 0}, "--max_steps"),
        ({"seeds": "0,x"}, "--seeds"),
        ({"max_distinct_blocks": 4}, "--max_distinct_blocks 4 must be below --n_layer 4"),
        ({"memory_depths": "2,8"}, "every depth must exceed --memory_max_distinct_blocks"),
        ({"dropout": 1.0}, r"--dropout must be in \[0, 1\), got 1.0"),
        ({"eval_interval": 0}, "--eval_interval must be >= 1"),
        ({"early_stopping_patience": -1}, "--early_stopping_patience must be >= 0, got -1"),
        ({"preset": "default", "early_stopping_patience": 3}, "--early_stopping_patience needs --eval_interval"),
        ({"task": "chains:length=8"}, "--task 'chains:length=8': expected '<name>:<config>' with a name among"),
        ({"lr_scheduler_type": "step"}, "--lr_scheduler_type 'step': expected one of linear, cosine"),
        ({"weight_decay": -0.1}, "--weight_decay must be >= 0, got -0.1"),
        ({"gradient_norm_interval": 0}, "--gradient_norm_interval must be >= 1"),
        ({"memory_gradient_checkpointing": "false,yes"}, "--memory_gradient_checkpointing 'false,yes': expected 'false', 'true'"),
    ],
)
def test_bad_flags_are_named(flags, named):
    with pytest.raises(ValueError, match=named):
        resolve_settings(BenchArguments(**{"preset": "tiny", **flags}))


# ----- the bench modules together -----


def bench_imports(path: Path) -> set[str]:
    """The bench modules `path` imports, at its top or inside a function (`from .x`, `from bench.x`, `import bench.x`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [f"bench.{node.module}" if node.level == 1 else node.module or ""]
        else:
            continue
        found |= {name.split(".")[1] for name in names if name.startswith("bench.")}
    return found


def test_no_bench_modules_import_each_other_in_a_circle():
    """A script's shared settings and row layout live in a module of their own (`settings.py` for the study,
    `compress_settings.py` for compression) that its runner and its report import, not in the script."""
    modules = {path.stem: path for path in (REPO_ROOT / "bench").glob("*.py") if path.stem != "__init__"}
    graph = {name: bench_imports(path) & modules.keys() for name, path in modules.items()}
    assert graph["compress"] >= {"compress_settings", "compress_run", "compress_report"}  # the parser sees them
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        pytest.fail(f"bench modules import each other in a circle: {' -> '.join(error.args[1])}")


# ----- bench/compress.py -----

COMPRESS_FIELDS = {
    "label", "seed", "map_choice", "tie_init", "lora_rank", "distinct_blocks", "test_loss", "peak_state_bytes",
    "peak_process_bytes", "train_seconds", "commit", "versions",
}  # fmt: skip


def _compress(results: Path, *flags: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO_ROOT / "bench" / "compress.py"), "--preset", "tiny", "--results_dir", str(results)]
    return subprocess.run(command + list(flags), capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=900)


@pytest.mark.slow
def test_compress_runs_every_row_at_the_budget_and_a_rerun_trains_nothing(tmp_path):
    from bench.compress_settings import PRESETS as COMPRESS_PRESETS
    from bench.compress_settings import plan

    settings = COMPRESS_PRESETS["tiny"]
    completed = _compress(tmp_path, "--jobs", "2")  # the teacher first, then its rows side by side
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    report = json.loads((tmp_path / "results.json").read_text())
    records = {record["label"]: record for record in report["records"]}
    assert set(records) == {row.label for row in plan(settings)}
    assert (tmp_path / "results.png").stat().st_size > 0  # the rows against the best way of training small
    distilled = {row.label for row in plan(settings) if row.distill}  # a smoke test: a conversion and a baseline
    # Distilled rows (from scratch too) name the seed's teacher they read, relative to the results folder.
    teacher = {"teacher": "seed0/teacher-model", "temperature": 2.0, "alpha": 5 / 7}
    for label, record in records.items():
        assert COMPRESS_FIELDS <= record.keys(), label
        assert math.isfinite(record["test_loss"])
        assert record["distill"] == (teacher if label in distilled else None), label
        ceiling = label.endswith("(ceiling)")
        assert record["distinct_peak"] == (settings.n_layer if ceiling else settings.distinct_blocks), label
        # The plain export, loaded by stock transformers, computes what was trained (adapters merged per position).
        assert record["export_logit_difference"] < 1e-4, label
    assert distilled & set(report["small_candidates"]["tied_gpt2"])  # the distilled baseline competes for best small
    # Converted rows start from the teacher, so they all hold its trained weights; the same memory as training small.
    small = records[f"untied {settings.distinct_blocks} blocks from scratch, uptraining steps"]
    assert records["converted, sequence, mean"]["peak_state_bytes"] == small["peak_state_bytes"]
    assert records["converted, sequence, mean"]["final_map"] == [0, 0, 2, 2]
    # The Llama family takes the same path from a plain LlamaForCausalLM teacher, relaxed ties included.
    llama = records["Llama: converted, sequence, mean, relaxed r = 8 (svd init)"]
    assert llama["model_type"] == "tied_llama" and llama["final_map"] == [0, 0, 2, 2] and llama["lora_rank"] == 8
    assert (tmp_path / "seed0" / "teacher-llama" / "config.json").read_text().count('"model_type": "llama"') == 1

    written = sorted(path.stat().st_mtime_ns for path in tmp_path.glob("**/result.json"))
    rerun = _compress(tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert sorted(path.stat().st_mtime_ns for path in tmp_path.glob("**/result.json")) == written


def test_compress_trains_each_missing_teacher_once_and_reports_its_rows_not_run_when_it_fails(tmp_path):
    """A fresh clone holds the teacher row's result but not the teacher's weights: the first unfinished row of the
    family trains the teacher while its other rows wait (two writers of one folder would corrupt it)."""
    from bench.compress import _RowQueue
    from bench.compress_settings import PRESETS as COMPRESS_PRESETS
    from bench.compress_settings import TEACHER_DIRS, plan

    rows = plan(COMPRESS_PRESETS["tiny"])
    gpt2 = [row for row in rows if row.model_type == "tied_gpt2" and row.needs_teacher]
    scratch = [row for row in rows if not row.needs_teacher]
    assert any(row.start == "scratch" and row.distill for row in gpt2)  # distilled from scratch: it waits too
    (tmp_path / "seed0" / gpt2[0].directory).mkdir(parents=True)
    (tmp_path / "seed0" / gpt2[0].directory / "result.json").write_text("{}")  # finished, its teacher not kept
    with tqdm(disable=True, total=len(gpt2 + scratch)) as progress:
        queue = _RowQueue(tmp_path, [(row, 0) for row in gpt2 + scratch], progress)
        assert progress.n == 0 and progress.total == len(gpt2 + scratch) - 1  # the finished row is not this run's
        leader = queue.next_job()
        assert leader.payload == (gpt2[1], 0)  # the first unfinished row trains the teacher
        started = [queue.next_job() for _ in scratch]
        assert [job.payload[0] for job in started] == scratch  # rows from scratch need no teacher
        assert queue.next_job() is None  # the family's other rows wait

        queue.finished(leader, returncode=1)  # it failed before a teacher was saved
        assert queue.next_job() is None and queue.queue == []
        assert sum("not run, the run that trains its teacher failed" in line for line in queue.failures) == len(gpt2) - 2

        teacher = tmp_path / "seed1" / TEACHER_DIRS["tied_gpt2"]
        teacher.mkdir(parents=True)
        for name in ("teacher_result.json", "model.safetensors"):
            (teacher / name).write_text("{}")
        queue = _RowQueue(tmp_path, [(row, 1) for row in gpt2], progress)
        assert all(isinstance(queue.next_job(), Job) for _ in gpt2)  # a teacher that is there: every row at once


def test_compress_pairs_each_row_with_the_best_small_overall_and_with_the_best_small_of_its_own_steps():
    """A user holding the trained model who spends the uptraining's steps compares a conversion with the best untied
    model of those steps (the teacher cut down, or blocks from scratch), chosen on validation loss; one who can also
    spend the teacher's steps, with the best small model overall."""
    from bench.compress_report import summarise
    from bench.compress_settings import PRESETS as COMPRESS_PRESETS
    from bench.compress_settings import plan

    rows = {row.label: row for row in plan(COMPRESS_PRESETS["tiny"]) if row.model_type == "tied_gpt2"}
    converted, pruned, truncated = "converted, sequence, mean", "teacher pruned to the 2 blocks similarity keeps", "teacher truncated to its first 2 blocks"
    short, long = "untied 2 blocks from scratch, uptraining steps", "untied 2 blocks from scratch, teacher + uptraining steps"
    # label: (test losses by seed, validation loss); the pruned teacher is the best of the uptraining's steps on
    # validation though not on the test, and the long run from scratch the best of all.
    losses = {converted: ([4.20, 4.30], 4.2), pruned: ([4.26, 4.28], 4.25), truncated: ([4.21, 4.27], 4.3), short: ([4.5, 4.6], 4.5), long: ([4.1, 4.2], 4.1)}  # fmt: skip
    table = {label: {} for label in rows}
    for label, (tests, validation) in losses.items():
        for seed, test in enumerate(tests):
            accuracy = {"mean_accuracy": 5 - test, "accuracy_by_hops": {"1": 5 - test}}  # on a task, paired as the loss
            table[label][seed] = {"test_loss": test, "validation_loss": validation, "distinct_peak": 2, "peak_state_bytes": 1, "peak_process_bytes": 1, "train_seconds": 1, **accuracy}  # fmt: skip
    summary = summarise(list(rows.values()), table)

    assert summary["best_small"]["tied_gpt2"] == long
    assert summary["best_small_by_steps"]["tied_gpt2"] == {"uptraining steps": pruned, "teacher + uptraining steps": long}
    assert {pruned, truncated, short, long} <= set(summary["small_candidates"]["tied_gpt2"])  # cut down or from scratch
    row = summary["rows"][converted]
    assert row["versus_best_small"]["mean"] == pytest.approx(statistics.fmean([4.20 - 4.1, 4.30 - 4.2]))
    assert row["versus_best_small_same_steps"]["mean"] == pytest.approx(statistics.fmean([4.20 - 4.26, 4.30 - 4.28]))
    assert row["accuracy_versus_best_small_same_steps"]["mean"] == pytest.approx(-row["versus_best_small_same_steps"]["mean"])
    assert summary["rows"][short]["versus_best_small_same_steps"]["mean"] == pytest.approx(statistics.fmean([4.5 - 4.26, 4.6 - 4.28]))
    assert summary["rows"][pruned]["versus_best_small_same_steps"] is None  # not paired with itself
    assert summary["rows"][long]["versus_best_small"] is None and summary["rows"][long]["versus_best_small_same_steps"] is None


def test_compress_pairs_only_runs_that_read_one_teacher_and_names_the_baseline_it_pairs_with_instead(tmp_path):
    """A seed's teacher trained again measures differently, so a row that read it is not paired with a baseline that
    read the first one: it is paired instead with the best baseline of its steps that read its teacher (or none),
    and the report names that baseline."""
    from bench.compress_report import _markdown, summarise
    from bench.compress_settings import PRESETS as COMPRESS_PRESETS
    from bench.compress_settings import plan
    from bench.report import verdict_cell

    rows = {row.label: row for row in plan(COMPRESS_PRESETS["tiny"]) if row.model_type == "tied_gpt2"}
    converted, distilled = "converted, sequence, mean", "converted, sequence, mean, relaxed r = 8 (svd init), distilled"
    pruned, short, short_distilled = "teacher pruned to the 2 blocks similarity keeps", "untied 2 blocks from scratch, uptraining steps", "untied 2 blocks from scratch, uptraining steps, distilled"  # fmt: skip
    first, again = 4.30, 4.28  # the seed's teacher, and the same seed's teacher trained again
    # label: (test losses by seed, validation loss, teacher); the pruned teacher is the best of the uptraining's steps
    losses = {converted: ([4.20, 4.30], 4.2, first), pruned: ([4.26, 4.28], 4.25, first), distilled: ([4.10, 4.20], 4.1, again), short: ([4.5, 4.6], 4.5, None), short_distilled: ([4.4, 4.45], 4.4, again)}  # fmt: skip
    table = {label: {} for label in rows}
    for label, (tests, validation, teacher) in losses.items():
        for seed, test in enumerate(tests):
            table[label][seed] = {"test_loss": test, "validation_loss": validation, "teacher_test_loss": teacher, "distinct_peak": 2, "peak_state_bytes": 1, "peak_process_bytes": 1, "train_seconds": 1, "export_logit_difference": 0.0}  # fmt: skip
    summary = summarise(list(rows.values()), table)

    assert summary["best_small_by_steps"]["tied_gpt2"]["uptraining steps"] == pruned
    assert summary["rows"][converted]["versus_best_small_same_steps"]["mean"] == pytest.approx(statistics.fmean([4.20 - 4.26, 4.30 - 4.28]))
    assert summary["rows"][short]["paired_with"]["best_small_same_steps"] == pruned  # read no teacher: pairs with any
    row = summary["rows"][distilled]
    assert row["paired_with"]["best_small_same_steps"] == short_distilled  # the best that read its teacher
    assert row["versus_best_small_same_steps"]["mean"] == pytest.approx(statistics.fmean([4.10 - 4.4, 4.20 - 4.45]))
    assert row["paired_instead_with"]["same steps"] == short_distilled
    line = next(line for line in _markdown(COMPRESS_PRESETS["tiny"], summary, []).splitlines() if line.startswith(f"| {distilled} |"))
    assert f"against {short_distilled} (the family's baseline read another teacher)" in line
    # Distilled against the same row undistilled: paired where one teacher (or none) was read.
    assert summary["rows"][short_distilled]["versus_undistilled"]["mean"] == pytest.approx(statistics.fmean([4.4 - 4.5, 4.45 - 4.6]))
    assert row["versus_undistilled"] is None  # its undistilled twin has not run
    relaxed = "converted, sequence, mean, relaxed r = 8 (svd init)"
    twin = summarise(list(rows.values()), table | {relaxed: {seed: run | {"teacher_test_loss": first} for seed, run in table[converted].items()}})
    assert twin["rows"][distilled]["versus_undistilled"] == {"left_out": 2, "left_out_why": "another teacher"}

    # A teacher trained again on one seed only: the row keeps the family's baseline on the other, saying so.
    table[distilled] = {0: table[distilled][0] | {"teacher_test_loss": first}, 1: table[distilled][1]}
    row = summarise(list(rows.values()), table)["rows"][distilled]
    assert row["paired_with"]["best_small_same_steps"] == pruned and row["paired_instead_with"] == {}
    assert row["versus_best_small_same_steps"]["mean"] == pytest.approx(4.10 - 4.26)
    assert (row["versus_best_small_same_steps"]["seeds"], row["versus_best_small_same_steps"]["left_out"]) == (1, 1)

    # A row sharing no seed with the family's baseline read no other teacher: it keeps that baseline, unpaired,
    # though another baseline has its seed.
    table[distilled], table[short] = {2: table[distilled][0]}, table[short] | {2: table[short][0]}
    row = summarise(list(rows.values()), table)["rows"][distilled]
    assert row["paired_with"]["best_small_same_steps"] == pruned and row["paired_instead_with"] == {}
    assert verdict_cell(row["versus_best_small_same_steps"]) == "not paired: absent from the baseline on 1 seed"


def test_compress_report_names_its_command_refuses_cutting_other_families_and_keeps_the_largest_export_difference():
    """The report's command reruns its settings (`--task` included); a teacher of another family than GPT-2 is not
    cut down; the export column holds the largest difference measured, whatever order the seeds come in."""
    from bench.compress_report import _command, _markdown, summarise
    from bench.compress_settings import PRESETS as COMPRESS_PRESETS
    from bench.compress_settings import Row, plan

    assert _command(COMPRESS_PRESETS["depth"]) == "python bench/compress.py --preset depth"
    task = "hop_induction:length=16,max_hops=2"
    assert _command(dataclasses.replace(COMPRESS_PRESETS["tiny"], task=task)) == f"python bench/compress.py --preset tiny --task '{task}'"
    with pytest.raises(ValueError, match="row 'cut'.*tied_llama"):
        Row("cut", "truncated", model_type="tied_llama")

    rows = [row for row in plan(COMPRESS_PRESETS["tiny"]) if row.model_type == "tied_gpt2"]
    run = {"test_loss": 4.0, "validation_loss": 4.0, "teacher_test_loss": None, "distinct_peak": 2, "peak_state_bytes": 1, "peak_process_bytes": 1, "train_seconds": 1}  # fmt: skip
    for measured_first in (True, False):
        runs = [run | {"export_logit_difference": 0.5}, dict(run)]  # the second recorded before the column existed
        table = {row.label: dict(enumerate(runs if measured_first else runs[::-1])) for row in rows}
        assert all(row["export_logit_difference"] == 0.5 for row in summarise(rows, table)["rows"].values())

    table[rows[-1].label] = {}  # a row that crashed on every seed is named, not dropped in silence
    summary = summarise(rows, table)
    assert summary["not_run"] == [rows[-1].label] and rows[-1].label not in summary["rows"]
    assert f"no finished run, so not in the table: {rows[-1].label}." in _markdown(COMPRESS_PRESETS["tiny"], summary, [])


def test_a_paired_difference_says_how_many_seeds_it_left_out_for_another_teacher():
    from bench.compress_report import _paired
    from bench.markdown_tables import format_value
    from bench.report import verdict_cell

    def runs(teachers, losses):
        return {seed: {"test_loss": loss, "teacher_test_loss": teacher} for seed, (teacher, loss) in enumerate(zip(teachers, losses))}

    table = {"baseline": runs([4.3, 4.3, 4.3], [4.0, 4.1, 4.2])}
    partly = _paired(runs([4.3, 4.3, 4.2], [3.9, 4.0, 9.9]), table, "baseline")
    assert partly["seeds"] == 2 and partly["mean"] == pytest.approx(-0.1) and partly["left_out"] == 1  # seed 2 left out
    assert verdict_cell(partly).endswith("[paired on 2 seeds; another teacher on 1]")
    assert format_value(partly, "difference").endswith("[paired on 2 seeds; another teacher on 1]")
    none = _paired(runs([4.2, 4.2], [3.9, 4.0]), table, "baseline")
    assert verdict_cell(none) == format_value(none, "verdict") == "not paired: another teacher on 2 seeds"
    table["baseline"].pop(2)  # mid-study: the baseline has not finished seed 2
    unfinished = _paired(runs([4.3, 4.3, 4.3], [3.9, 4.0, 4.1]), table, "baseline")
    assert verdict_cell(unfinished).endswith("[paired on 2 seeds; absent from the baseline on 1]")
    both = _paired(runs([4.3, 4.2, 4.3], [3.9, 4.0, 4.1]), table, "baseline")
    assert verdict_cell(both).endswith("[paired on 1 seed; another teacher or absent from the baseline on 2]")


@pytest.mark.parametrize(
    "flags, named",
    [
        ({"jobs": 0}, "--jobs must be >= 1, got 0"),
        ({"seeds": "1,a"}, "--seeds '1,a'"),
        ({"preset": "huge"}, "--preset 'huge': expected one of default, depth, tiny"),
        ({"task": "chains:length=8"}, "--task 'chains:length=8': expected '<name>:<config>'"),
    ],
)
def test_bad_compress_flags_are_named(flags, named):
    from bench.compress import CompressArguments

    with pytest.raises(ValueError, match=named):
        CompressArguments(**flags)


def test_a_report_template_missing_a_value_fails_instead_of_printing_nothing():
    """bench/templates: a value the page names but was not given (a renamed key, a context left out) is an error."""
    import jinja2

    from bench.templates import render

    with pytest.raises(jinja2.UndefinedError, match="tuning"):
        render("learning_rates.md.jinja")
    with pytest.raises(jinja2.UndefinedError, match="max_grad_norm"):  # formatted by a filter: the same error
        render("recipe.md.jinja", payload={"choice": {"recipe": None}}, sources="")


def test_each_strategy_trains_at_the_learning_rate_chosen_on_its_validation_loss(tmp_path):
    from bench.report import collect_study, read_learning_rates, write_learning_rates
    from bench.settings import RunSpec, at_learning_rate, at_learning_rates, control_runs, runs_after
    from bench.templates import render

    settings = resolve_settings(BenchArguments(preset="tiny"))  # its own rate: 3e-3
    grid = (1e-3, 3e-3, 1e-2)
    tuning = [at_learning_rate(RunSpec(label, label, 0), rate, settings) for label in ("none", "dlt") for rate in grid]
    assert [spec.directory for spec in tuning[:3]] == ["study/none-lr0.001/seed0", "study/none/seed0", "study/none-lr0.01/seed0"]

    # Seed 0 of two labels at three rates, as --tune_learning_rates leaves them (the test loss plays no part), and
    # one follower of DLT's (its final map from scratch) at 1e-2 only, as a tuning stopped early leaves it. The
    # lowest validation loss during training decides.
    validation = {("none", 1e-3): 4.4, ("none", 3e-3): 4.2, ("none", 1e-2): 4.9, ("dlt", 1e-3): 4.6, ("dlt", 3e-3): 4.7, ("dlt", 1e-2): 4.5}
    dlt_result = {"final_map": [0, 0, 2, 2], "distinct_final": 2, "distinct_mean": 2.0}
    for spec in tuning:
        loss = validation[spec.label, spec.learning_rate or settings.learning_rate]
        record = {"learning_rate": spec.learning_rate or settings.learning_rate, "validation_loss": loss + 1, "test_loss": 11 - loss}
        record |= {"test_loss_at_best_validation": 10 - loss}  # the selected model's: what the table shows
        record |= {"validation_curve": [{"step": 100, "validation_loss": loss}]} | dlt_result
        (tmp_path / spec.directory).mkdir(parents=True)
        (tmp_path / spec.directory / "result.json").write_text(json.dumps(record))
    follower = next(run for run in runs_after(tuning[-1], dlt_result, settings) if run.label == "dlt final map, from scratch")
    (tmp_path / follower.directory).mkdir(parents=True)
    (tmp_path / follower.directory / "result.json").write_text(json.dumps({"learning_rate": 1e-2, "validation_loss": 4.0, "test_loss": 5.0}))

    written = json.loads(write_learning_rates(tmp_path, settings, grid, tuning).read_text())
    assert written["chosen"] == {"none": 3e-3, "dlt": 1e-2}  # the follower has not run at every rate: no choice
    assert written["validation_loss"]["none"] == {"0.001": 4.4, "0.003": 4.2, "0.01": 4.9}
    tuned = read_learning_rates(tmp_path)
    assert tuned["grid"] == written["grid"] and tuned["file"] == str(tmp_path.resolve() / "learning_rates.json")
    table = render("learning_rates.md.jinja", tuning=tuned).splitlines()  # as the report shows the grid
    assert table[0].startswith(f"Learning rates chosen on validation loss ({tuned['file']}, seed 0;")
    assert "| strategy | lr 0.001 | lr 0.003 | lr 0.01 | chosen | its test loss (at 0.003) |" in table
    assert "| none | 4.400 | 4.200 | 4.900 | 0.003 | 5.800 (5.800) |" in table
    assert "| dlt | 4.600 | 4.700 | 4.500 | 0.01 | 5.500 (5.300) |" in table
    assert "| dlt final map, from scratch | - | - | 4.000 | - | - |" in table
    # A grid without the preset's rate (a re-tuning around the chosen rate) has no bracketed loss to announce.
    narrowed_grid = {"grid": [1e-3, 1e-2], "validation_loss": {"none": {"0.001": 4.4, "0.01": 4.9}}, "chosen": {"none": 1e-3}}
    narrowed = render("learning_rates.md.jinja", tuning=tuned | narrowed_grid | {"selected_test_loss": {"none": {"0.001": 5.6, "0.01": 5.1}}}).splitlines()
    assert "| strategy | lr 0.001 | lr 0.01 | chosen | its test loss |" in narrowed
    assert "| none | 4.400 | 4.900 | 0.001 | 5.600 |" in narrowed
    chosen = tuned["chosen"]
    # The report reads each strategy at its chosen rate, or, with --tuned_learning_rates false, at the preset's.
    assert collect_study(settings, tmp_path, chosen)["dlt"][0]["learning_rate"] == 1e-2
    assert collect_study(settings, tmp_path)["dlt"][0]["learning_rate"] == 3e-3

    specs = at_learning_rates([RunSpec("none", "none", 1), RunSpec("dlt", "dlt", 1)], chosen, settings)
    assert [spec.directory for spec in specs] == ["study/none/seed1", "study/dlt-lr0.01/seed1"]  # none kept the preset's rate: its runs are the study's own
    assert all(f.learning_rate is None for f in runs_after(specs[1], dlt_result, settings, chosen))  # not tuned: the preset's rate
    assert all(f.learning_rate == 1e-2 for f in runs_after(specs[1], dlt_result, settings))  # tuning: the leader's
    # A control changes settings of its strategy and trains at that strategy's rate, though never tuned itself.
    controls = at_learning_rates(control_runs(settings, 1), chosen, settings)
    assert {spec.label: spec.learning_rate for spec in controls if spec.rate_of == "dlt"} == {
        "dlt, exploration 20%": 1e-2, "dlt, exploration 20%, then commit": 1e-2, "dlt, k = 15": 1e-2, "dlt, k = 50": 1e-2
    }  # fmt: skip
    assert next(spec for spec in controls if spec.rate_of == "dlt (paper agent)").learning_rate is None


@pytest.mark.parametrize("preset", [name for name, settings in PRESETS.items() if settings.controls])
def test_the_commit_control_commits_early_and_differs_from_its_pair_by_the_commit_alone(preset):
    """Committing can only change what a run selects if exploration ends before its best-validation step: in `paper`
    DLT's are at steps 1,600-2,300 (bench/reports/study/paper/results.json), where the default 80% of 6,000 planned steps
    would end exploration at 4,800, after every run had stopped."""
    from bench.settings import control_runs

    settings = PRESETS[preset]
    controls = {spec.label: spec for spec in control_runs(settings, 0)}
    explore, commit = controls["dlt, exploration 20%"], controls["dlt, exploration 20%, then commit"]
    assert dict(commit.tying) == dict(explore.tying) | {"commit_after_exploration": True}
    assert (explore.strategy, explore.dlt_variant, explore.rate_of) == (commit.strategy, commit.dlt_variant, "dlt")
    assert dict(commit.tying)["exploration_fraction"] * settings.max_steps <= 1200  # paper: step 1,200 of 6,000


def test_learning_rates_from_a_folder_without_a_grid_is_refused_by_name(tmp_path):
    completed = _bench(tmp_path / "study", "--learning_rates_from", str(tmp_path), "--report_only", "true")
    assert completed.returncode != 0
    assert f"--learning_rates_from {tmp_path}: no learning_rates.json there" in completed.stderr
    assert not (tmp_path / "study").exists()  # refused before the results folder is claimed


def test_rows_queue_only_the_named_rows_without_followers(tmp_path):
    """`--rows` as the recipe grid uses it (the two rows its choice is made on), and on the default plan: only the
    named labels, every seed, and a finished DLT run queues none of the layouts that follow it without `--rows`."""
    from bench.settings import parse_rows

    recipe = dataclasses.replace(PRESETS["recipe"], seeds=(0, 1))
    rows = parse_rows("cycle @ U | untied, 2 blocks", recipe)
    queued = [(spec.label, spec.seed) for _, spec in Scheduler(recipe, tmp_path, 1, with_memory=False, rows=rows).queue]
    assert sorted(queued) == [("cycle @ U", 0), ("cycle @ U", 1), ("untied, 2 blocks", 0), ("untied, 2 blocks", 1)]

    default = dataclasses.replace(PRESETS["default"], seeds=(0,))
    dlt = next(spec for spec in Scheduler(default, tmp_path, 1, with_memory=False).queue if spec[1].label == "dlt")
    (tmp_path / dlt[1].directory).mkdir(parents=True)
    write_complete(tmp_path / dlt[1].directory / "result.json", {"final_map": [0] * 12, "distinct_final": 1, "distinct_mean": 1.0})
    for named, followers in ((None, 7), (parse_rows("dlt", default), 0)):
        scheduler = Scheduler(default, tmp_path, 1, with_memory=False, rows=named)
        scheduler.progress, before = tqdm(total=0, disable=True), len(scheduler.queue)
        scheduler._after(*dlt)
        assert len(scheduler.queue) - before == followers


def test_tuning_some_rows_keeps_the_rates_the_other_rows_chose(tmp_path, monkeypatch):
    """The partial preset's committed grid (seed 0: untied 4 blocks and `0 1 1 3 4` at every rate): a tuning of one
    row writes learning_rates.json from every row's finished grid, not from that row's alone."""
    import shutil

    from bench.run_bench import main

    results = tmp_path / "partial"
    shutil.copytree(REPO_ROOT / "bench" / "results" / "partial", results, ignore=shutil.ignore_patterns("*.png", "*.jsonl", "log.txt"))
    argv = ["run_bench.py", "--preset", "partial", "--results_dir", str(results), "--tune_learning_rates", "1e-3,3e-3,1e-2"]
    monkeypatch.setattr(sys, "argv", [*argv, "--rows", "untied, 4 blocks", "--report_only", "true"])
    main()
    tuning = json.loads((results / "learning_rates.json").read_text())
    chosen = tuning["chosen"]
    assert chosen["untied, 4 blocks"] == chosen["loop middle, 5 positions (0 1 1 3 4)"] == 0.003  # the latter not tuned now
    assert tuning["seed"] == 0


def test_the_partial_study_reports_none_of_the_seed_its_rates_were_chosen_on(tmp_path):
    """Each row's run at its chosen rate is the best of its grid on validation loss: among the reported seeds it would
    flatter every row by its own amount."""
    from bench.settings import grid_seed

    settings = PRESETS["partial"]
    assert grid_seed(settings) == 0 and settings.seeds == tuple(range(1, 11))
    assert {spec.seed for _, spec in Scheduler(settings, tmp_path, 1, with_memory=False).queue} == set(settings.seeds)
    assert grid_seed(PRESETS["default"]) == PRESETS["default"].seeds[0]  # its seed-0 runs count, as its README says


def test_a_row_not_in_the_plan_is_refused_by_name_before_the_folder_is_claimed(tmp_path, monkeypatch):
    from bench.run_bench import main

    results = tmp_path / "recipe"
    argv = ["run_bench.py", "--preset", "recipe", "--results_dir", str(results), "--rows", "cycle @ U|cycle @ 3"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match=r"--rows: 'cycle @ 3' is not a row of this plan; its rows: .*cycle @ U"):
        main()
    assert not results.exists()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--tune_learning_rates", "1e-3,x"], r"--tune_learning_rates '1e-3,x': expected comma-separated learning rates"),
        (["--memory_only", "true", "--skip_memory", "true"], "--memory_only with --skip_memory: the first trains only the memory runs"),
        (["--memory_only", "true", "--rows", "cycle @ U"], "--memory_only with --rows"),
        (["--learning_rates_from", "elsewhere", "--tuned_learning_rates", "false"], "--learning_rates_from elsewhere with --tuned_learning_rates false"),
    ],
)
def test_flags_that_would_do_nothing_or_contradict_are_refused_before_the_folder_is_claimed(tmp_path, monkeypatch, flags, message):
    from bench.run_bench import main

    results = tmp_path / "recipe"
    monkeypatch.setattr(sys, "argv", ["run_bench.py", "--preset", "recipe", "--results_dir", str(results), *flags])
    with pytest.raises(ValueError, match=message):
        main()
    assert not results.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_a_gpu_preset_without_cuda_is_refused_before_the_folder_is_claimed(tmp_path, monkeypatch):
    from bench.run_bench import main

    results = tmp_path / "gpu"
    monkeypatch.setattr(sys, "argv", ["run_bench.py", "--preset", "gpu", "--results_dir", str(results)])
    with pytest.raises(SystemExit, match="--use_gpu .* needs a CUDA device"):
        main()
    assert not results.exists()


@pytest.mark.parametrize("text", ["", "0.001,x", "0", "3"])
def test_a_bad_learning_rate_grid_is_named(text):
    from bench.settings import parse_learning_rates

    with pytest.raises(ValueError, match=r"--tune_learning_rates .*expected comma-separated learning rates in \(0, 1\)"):
        parse_learning_rates(text)


# A scheduler (`run_jobs`, as every bench script uses it) of one job that writes its process id to its log and sleeps,
# a fresh process or forked from a template (`Job.forked`).
SCHEDULER = """
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[1])
from bench.scheduling import Job, run_jobs

sleeper = [sys.executable, sys.argv[3], sys.argv[4]]
jobs = [Job("sleeper", Path(sys.argv[2]), sleeper, forked=sys.argv[5] == "forked")]
run_jobs(lambda: jobs.pop() if jobs else None, lambda job, code: print(job.failure(code) if code else "trained"), 1)
"""
SLEEPER = "import os, sys, time\nif __name__ == '__main__':\n    print(os.getpid(), flush=True)\n    time.sleep(float(sys.argv[1]))\n"


def _scheduler(run_dir: Path, seconds: float, start: str) -> list[str]:
    sleeper = run_dir.parent / "sleeper.py"
    sleeper.write_text(SLEEPER)
    return [sys.executable, "-c", SCHEDULER, str(REPO_ROOT), str(run_dir), str(sleeper), str(seconds), start]


def test_a_forked_run_exits_as_its_script_would_with_its_output_in_its_log(tmp_path):
    """Exit codes, a `sys.exit` message, a traceback and the thread count a fresh process would have had."""
    script = tmp_path / "script.py"
    script.write_text(
        "import sys, torch\n"
        "if __name__ == '__main__':  # a template imports the script without running it\n"
        "    print('threads', torch.get_num_threads(), flush=True)\n"
        "    if sys.argv[1] == 'raise':\n        raise ValueError('a bad value')\n"
        "    sys.exit(int(sys.argv[1]) if sys.argv[1].isdigit() else sys.argv[1])\n"
    )
    jobs = [Job(outcome, tmp_path / outcome, [sys.executable, str(script), outcome], {"OMP_NUM_THREADS": "1"}, forked=True) for outcome in ("0", "3", "a message", "raise")]
    codes = {}
    run_jobs(lambda: jobs.pop(0) if jobs else None, lambda job, code: codes.update({job.name: code}), 2)
    assert codes == {"0": 0, "3": 3, "a message": 1, "raise": 1}
    logs = {name: (tmp_path / name / "log.txt").read_text() for name in codes}
    assert all(log.startswith("threads 1\n") for log in logs.values()), logs
    assert logs["a message"].endswith("a message\n")
    assert "ValueError: a bad value" in logs["raise"]


def test_a_run_another_scheduler_finished_since_it_was_queued_is_not_run_again(tmp_path):
    """The result is checked again once the folder's lock is held: its log and result stay the other process's."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_complete(run_dir / "result.json", {"finished": "elsewhere"})
    (run_dir / "log.txt").write_text("the other scheduler's run\n")
    jobs = [Job("run", run_dir, [sys.executable, "-c", "raise SystemExit(3)"])]
    codes = []
    run_jobs(lambda: jobs.pop() if jobs else None, lambda job, code: codes.append(code), 1)
    assert codes == [0]
    assert (run_dir / "log.txt").read_text() == "the other scheduler's run\n"
    assert json.loads((run_dir / "result.json").read_text()) == {"finished": "elsewhere"}


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="PR_SET_PDEATHSIG and /proc are Linux's")
def test_a_template_that_dies_takes_its_runs_with_it_and_the_scheduler_goes_on(tmp_path):
    """An interrupt sent to the whole process group ends the template too: its runs end with it and report -SIGKILL,
    as fresh processes killed so would, and the scheduler ends normally."""
    script = tmp_path / "sleeper.py"
    script.write_text("import os, time\nif __name__ == '__main__':\n    print(os.getpid(), os.getppid(), flush=True)\n    time.sleep(60)\n")
    jobs = [Job("sleeper", tmp_path / "run", [sys.executable, str(script)], forked=True)]
    codes = []

    def kill_the_template():
        run, template = _started_job(tmp_path / "run", fields=2)
        os.kill(template, signal.SIGKILL)
        codes.append(run)

    killer = threading.Thread(target=kill_the_template)
    killer.start()
    run_jobs(lambda: jobs.pop() if jobs else None, lambda job, code: codes.append(code), 1)
    killer.join()
    run, code = codes
    assert code == -signal.SIGKILL
    deadline = time.monotonic() + 5
    while _alive(run) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(run)


def _started_job(run_dir: Path, fields: int = 1):
    """The process id (or the `fields` numbers) the scheduler's job wrote to its log, once it has."""
    log = run_dir / "log.txt"
    deadline = time.monotonic() + 30
    while not (log.is_file() and log.read_text().endswith("\n")):
        assert time.monotonic() < deadline, f"the job never started: {log}"
        time.sleep(0.05)
    numbers = [int(number) for number in log.read_text().split()]
    return numbers[0] if fields == 1 else numbers


def _alive(pid: int) -> bool:
    """Whether `pid` still runs; a zombie (ended, not yet reaped by whatever adopted it) does not."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def _end(process: subprocess.Popen, job: int) -> None:
    """Leave nothing running, whatever the test found."""
    process.kill()
    process.wait()
    if _alive(job):
        os.kill(job, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="PR_SET_PDEATHSIG and /proc are Linux's")
@pytest.mark.parametrize("start", ["fresh", "forked"])
def test_a_scheduler_killed_by_sigkill_takes_its_runs_with_it(tmp_path, start):
    """`kill -9` of a bench script runs none of its clean-up; its runs must not train on unseen (a forked run dies
    with its template, which dies with the scheduler)."""
    scheduler = subprocess.Popen(_scheduler(tmp_path / "run", 60, start), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    job = _started_job(tmp_path / "run")
    try:
        scheduler.kill()
        scheduler.wait()
        deadline = time.monotonic() + 5
        while _alive(job) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(job), f"process {job} of the killed scheduler still runs"
    finally:
        _end(scheduler, job)


@pytest.mark.parametrize("start", ["fresh", "forked"])
def test_a_second_scheduler_leaves_a_folder_another_process_is_training_alone(tmp_path, start):
    """An immediate re-run (or a second study on the same results) skips the folders still training, by name, and
    leaves their log alone; a forked run holds its folder's lock as a fresh one does."""
    run_dir = tmp_path / "run"
    first = subprocess.Popen(_scheduler(run_dir, 60, start), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    job = _started_job(run_dir)
    try:
        second = subprocess.run(_scheduler(run_dir, 0, start), capture_output=True, text=True, timeout=60)
        assert second.returncode == 0, second.stderr
        assert second.stdout == f"sleeper: not run, another process is training {run_dir} (it holds {run_dir / '.lock'})\n"
        assert (run_dir / "log.txt").read_text() == f"{job}\n"
    finally:
        _end(first, job)


def test_the_sharding_bench_counts_ddp_gradient_buckets_in_the_training_state(tmp_path):
    """DDP's reducer all-reduces through flat buckets, a second copy of the gradients unless they are views of the
    buckets: the FSDP2-vs-DDP comparison counts them in DDP's training state, as DDP sizes them."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from bench.sharding import ddp_bucket_bytes

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 4))
        parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        assert ddp_bucket_bytes(DistributedDataParallel(model)) == parameter_bytes
        assert ddp_bucket_bytes(DistributedDataParallel(model, gradient_as_bucket_view=True)) == 0  # counted as gradients
        assert ddp_bucket_bytes(model) == 0
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_step_time_times_every_loop_of_a_partial_preset_under_its_own_map_against_untied_in_the_same_round(capsys):
    """bench/step_time.py: each layout the preset trains is timed with its own map through the study's path, and its
    ratio is to the untied blocks timed in the same round, the median over rounds; each round starts one layout
    later, so that no layout is always timed first (a load that drifts within a round falls on every layout). The
    longest layouts are timed again with their repeated positions skipped, their active positions U."""
    from bench.settings import partial_loop_runs
    from bench.step_time import StepTimeArguments, markdown, measure

    task = "hop_induction:length=16,max_hops=2,train_examples=200,eval_examples=40"
    settings = dataclasses.replace(PRESETS["partial-depth"], task=task, block_size=18, n_embd=32, n_head=2, batch_size=2)
    payload = measure(settings, StepTimeArguments(preset="partial-depth", steps=2, warmup_steps=1, rounds=2))
    specs = partial_loop_runs(settings, settings.seeds[0])
    skipping = [spec for spec in specs if spec.num_blocks == 6]
    labels = [spec.label for spec in specs] + [f"{spec.label}, repeats skipped" for spec in skipping]
    assert list(payload["rows"]) == labels
    untied = payload["rows"]["untied, 3 blocks"]
    assert untied["map"] == [0, 1, 2] and untied["ratio_to_untied"] == 1.0
    for label in labels[1:]:
        row = payload["rows"][label]
        spec = next(spec for spec in specs if label.startswith(spec.label))
        assert row["map"] == [int(block) for block in spec.strategy.removeprefix("static:").split(",")]
        assert row["positions"] == len(row["map"])
        # A step computes the first use of each block only, when the repeats are skipped: U = 3 positions.
        repeats = [position for position, block in enumerate(row["map"]) if block in row["map"][:position]]
        assert row["skipped_positions"] == (repeats if label.endswith("repeats skipped") else None)
        assert row["active_positions"] == (3 if row["skipped_positions"] else len(row["map"]))
        assert row["positions_ratio"] == row["active_positions"] / 3
        ratios = [seconds / base for seconds, base in zip(row["seconds_by_round"], untied["seconds_by_round"])]
        assert len(ratios) == 2 and row["ratio_to_untied"] == statistics.median(ratios)
        assert (row["ratio_lowest"], row["ratio_highest"]) == (min(ratios), max(ratios))
    assert "| loop middle, 4 positions (0 1 1 3) | 4 | 4 | " in markdown(payload)
    assert "| loop middle, 6 positions (0 1 1 1 1 5), repeats skipped | 6 | 3 | " in markdown(payload)
    assert f"Hardware: {payload['hardware']}; 1-minute load average" in markdown(payload)
    timed = [line.split("  ", 1)[1].rsplit(":", 1)[0] for line in capsys.readouterr().out.splitlines() if line.startswith("round ")]
    assert timed == labels + labels[1:] + labels[:1]
