"""From finished runs to `results.json`, `results.md` and two plots, with paired statistics.

Intervals are 95% Student-t intervals over seeds. A difference is a paired difference: the same seed (same initial
weights, same data order) under two strategies, so the seed-to-seed spread cancels. A difference whose interval
contains 0 is reported as "no difference detected", whatever the sign of its mean. A loss difference also gets an
equivalence test against a margin of 0.05 nats, proposed in issue 18 before the runs it judges: two one-sided tests at
5% (the 90% interval inside +/- 0.05), so that "no difference" says whether the difference was shown to be small.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterator
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from scipy import stats  # noqa: E402

from .markdown_tables import MIB, seeds_text  # noqa: E402
from .markdown_tables import verdict_cell as _plain_verdict_cell  # noqa: E402
from .measure import evaluation_coverage  # noqa: E402
from .provenance import hardware, source, source_lines  # noqa: E402
from .scheduling import write_whole  # noqa: E402
from .settings import (  # noqa: E402
    FINAL_MAP_LABEL,
    RANDOM_FINAL_MAP_LABEL,
    RECIPE_REPORT,
    REPO_ROOT,
    SIMILARITY_FINAL_MAP_LABEL,
    STATIC_LAYOUTS,
    BenchArguments,
    BenchSettings,
    RunSpec,
    at_learning_rates,
    core_runs,
    freeze_recipe,
    independent_runs,
    measured_under,
    memory_runs,
    plan_contrasts,
    recipe_runs,
    resolve_settings,
    runs_after,
    untied_label,
)
from .templates import render  # noqa: E402


def load_result(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


def _try_load(output: Path, spec: RunSpec) -> dict | None:
    path = output / spec.directory
    return load_result(path) if (path / "result.json").is_file() else None


LEARNING_RATES_FILE = "learning_rates.json"


def read_learning_rates(folder: Path) -> dict | None:
    """What `--tune_learning_rates` wrote in `folder` (its grid, and each strategy's choice under "chosen"), and
    where (under "file"); None if it never ran there."""
    path = folder / LEARNING_RATES_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text()) | {"file": shown_path(path)}


def shown_path(path: Path) -> str:
    """`path` relative to the repository where it lies inside it: the same in every clone's report."""
    path = path.resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def write_learning_rates(output: Path, settings: BenchSettings, grid: tuple[float, ...], runs: list[RunSpec]) -> Path:
    """Each label's rate with the lowest validation loss among its finished `runs` (the test plays play no part in
    the choice): the lowest evaluated during training where runs were evaluated then (the model the paper would
    select), else the last."""
    losses: dict[str, dict[str, float]] = {}
    selected: dict[str, dict[str, float]] = {}  # what each rate's selected model scores on test: shown, never chosen on
    for spec, run in _with_followers(output, runs, settings):  # followers at their leader's rate, as the tuning ran them
        if run is not None:
            rate = f"{run['learning_rate']:g}"
            losses.setdefault(spec.label, {})[rate] = _selection_loss(run)
            selected.setdefault(spec.label, {})[rate] = _selected_test_loss(run)
    # A label chooses once it has run at every rate: a tuning stopped early leaves the others at the preset's rate.
    chosen = {label: float(min(by_rate, key=lambda rate: _ranked(by_rate[rate]))) for label, by_rate in losses.items() if len(by_rate) == len(grid)}
    tuning = {
        "grid": list(grid), "seed": runs[0].seed, "preset_learning_rate": settings.learning_rate,
        "validation_loss": losses, "selected_test_loss": selected, "chosen": chosen,
    }  # fmt: skip
    path = output / LEARNING_RATES_FILE
    write_whole(path, json.dumps(tuning, indent=2))
    return path


def preset_study(preset: str, folder: Path) -> dict[str, dict[int, dict]]:
    """`collect_study` of the runs of preset `preset` in `folder` (its own results, or a rerun's `--results_dir`):
    {} where none was measured yet (no settings.json); a folder measured under other settings than the preset's is
    refused, naming it. A `frozen_recipe` preset's runs are read under the recipe the folder was claimed under."""
    if not (folder / "settings.json").is_file():
        return {}
    arguments = BenchArguments(preset=preset)
    settings = freeze_recipe(resolve_settings(arguments), arguments, folder)
    if not measured_under(folder, settings):
        raise ValueError(f"{folder} holds runs measured under other settings than preset {preset!r}'s ({folder / 'settings.json'})")
    return collect_study(settings, folder)


def collect_study(settings: BenchSettings, output: Path, learning_rates: dict[str, float] | None = None) -> dict[str, dict[int, dict]]:
    """label -> seed -> result, for every finished study run (in the plan's order of labels), each label at its
    learning rate in `learning_rates` (`read_learning_rates`), the preset's without."""
    table: dict[str, dict[int, dict]] = {}
    for seed in settings.seeds:
        runs = at_learning_rates(independent_runs(settings, seed), learning_rates, settings)
        for spec, result in _with_followers(output, runs, settings, learning_rates):
            table.setdefault(spec.label, {})
            if result is not None:
                table[spec.label][seed] = result
    return table


def _with_followers(
    output: Path, specs: list[RunSpec], settings: BenchSettings, learning_rates: dict[str, float] | None = None
) -> Iterator[tuple[RunSpec, dict | None]]:
    """Each of `specs` with its result (None until it has finished), then the runs the finished ones make possible
    (`runs_after`: static layouts at DLT's budget, final maps), in the plan's order, each result read once."""
    pending = list(specs)
    while pending:
        spec = pending.pop(0)
        result = _try_load(output, spec)
        if result is not None:
            pending += runs_after(spec, result, settings, learning_rates)
        yield spec, result


def interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of its two-sided t-interval at `confidence` (nan with fewer than 2 values, and where a
    value is not finite: a run that diverged makes the mean inf or nan, which the tables print as it is)."""
    mean = statistics.fmean(values)
    if len(values) < 2 or not all(math.isfinite(value) for value in values):
        return mean, math.nan
    return mean, float(stats.t.ppf((1 + confidence) / 2, len(values) - 1)) * statistics.stdev(values) / math.sqrt(len(values))


EQUIVALENCE_MARGIN = 0.05  # nats per token
LOSS_KEYS = ("test_loss", "test_loss_at_best_validation")
# The paired differences a report's tables show, by name (`summarise`'s `versus`) with their column headers: the
# study's baselines, and a partial loop's (`plan_contrasts`).
STUDY_CONTRASTS = {"none": "vs none", "untied U": "vs untied U", "random": "vs random", "best static": "vs best static"}
LOOP_CONTRASTS = {"untied U": "vs untied U", "loop at start": "vs the loop at the start", "loop at end": "vs the loop at the end"}


def paired_difference(runs: dict[int, dict], baseline: dict[int, dict], key: str = "test_loss") -> dict | None:
    """Mean and interval of runs[seed][key] - baseline[seed][key] over the seeds both have; for a loss, also
    whether it is shown to lie within +/- EQUIVALENCE_MARGIN."""
    seeds = sorted(runs.keys() & baseline.keys())
    if not seeds:
        return None
    differences = [runs[seed][key] - baseline[seed][key] for seed in seeds]
    mean, half = interval(differences)
    difference = {"mean": mean, "half_width": half, "seeds": len(seeds), "verdict": _verdict(mean, half)}
    if key in LOSS_KEYS and len(seeds) > 1:
        difference["equivalent_within_margin"] = equivalent(differences, EQUIVALENCE_MARGIN)
    return difference


def row_difference(runs: dict[int, dict], other: dict[int, dict], key: str = "test_loss") -> dict | None:
    """`paired_difference` of two rows of a study table, counting in `left_out` this row's seeds the other row lacks:
    the cell then says that it paired fewer seeds than the row shows."""
    difference = paired_difference(runs, other, key)
    unmatched = len(runs.keys() - other.keys())
    return difference | {"left_out": unmatched, "left_out_why": "absent from the other row"} if difference and unmatched else difference


def equivalent(differences: list[float], margin: float) -> bool:
    """Two one-sided t-tests at 5% each, i.e. the 90% interval inside +/- margin: is the mean difference shown to
    be above -margin and below +margin?"""
    mean, half_90 = interval(differences, confidence=0.90)
    return abs(mean) + half_90 < margin


def _verdict(mean: float, half: float) -> str:
    if not math.isfinite(mean):
        return "not finite: a run diverged"
    if math.isnan(half):
        return "one seed: no interval yet"
    if abs(mean) <= half:
        return "no difference detected"
    return "lower" if mean < 0 else "higher"


def summarise(table: dict[str, dict[int, dict]], contrasts_of: dict[str, dict[str, str]], static_layouts: list[str]) -> dict[str, dict]:
    """One row per label: quality, budget, memory, time, overhead and paired differences, with the study's baselines
    and, for a label of `contrasts_of` (`plan_contrasts`: label -> {name: other label}), with those rows too. The best
    static layout is the lowest of `static_layouts` (`static_candidates`)."""
    measured = {label: runs for label, runs in table.items() if runs}
    # Chosen on validation loss: choosing the baseline on the test plays would flatter it. Under model selection,
    # on each run's lowest validation loss, the loss its selected model is chosen by.
    best_static = _lowest(static_layouts, measured, lambda run: run["validation_loss"])
    best_static_selected = _lowest(static_layouts, measured, _lowest_validation_loss)
    untied = next((label for label in measured if label.startswith("untied, ")), None)
    baselines = (
        ("none", "none"), ("untied U", untied), ("random", "random"), ("best static", best_static), ("dlt", "dlt"),
        ("random final map", RANDOM_FINAL_MAP_LABEL),
    )  # fmt: skip
    selection_baselines = tuple((name, best_static_selected if name == "best static" else other) for name, other in baselines)
    rows = {}
    for label, runs in measured.items():
        results = list(runs.values())
        loss, loss_half = interval([run["test_loss"] for run in results])
        def contrasts(named_baselines, budget: str = "distinct_final") -> list[tuple[str, str]]:
            """The baselines this row is paired with: measured, not itself, the best static layout only at the
            budget the row's runs had (`budget`: a record's distinct blocks where its model is judged)."""
            return [
                (name, other) for name, other in named_baselines
                if other in measured and other != label and (name != "best static" or _same_budget(runs, measured[other], budget))
            ]  # fmt: skip

        paired = contrasts(baselines) + [(name, other) for name, other in contrasts_of.get(label, {}).items() if other in measured]
        rows_versus = {name: row_difference(runs, measured[other]) for name, other in paired}
        rows[label] = {
            "seeds": sorted(runs),
            "test_loss": loss,
            "test_loss_half_width": loss_half,
            "test_perplexity": math.exp(loss),
            "validation_loss": statistics.fmean(run["validation_loss"] for run in results),
            "distinct_final": statistics.fmean(run["distinct_final"] for run in results),
            "distinct_mean": statistics.fmean(run["distinct_mean"] for run in results),
            "distinct_peak": max(run["distinct_peak"] for run in results),
            "peak_state_mib": statistics.fmean(run["peak_state_bytes"] for run in results) / MIB,
            "peak_process_mib": statistics.fmean(run["peak_process_bytes"] for run in results) / MIB,
            "train_seconds": statistics.fmean(run["train_seconds"] for run in results),
            "seconds_per_step": _seconds_per_step(results),
            "positions": statistics.fmean(run["num_blocks"] for run in results),
            "agent_overhead": statistics.fmean(sum(run["tying_seconds"].values()) / run["train_seconds"] for run in results),
            "versus": rows_versus,
            "selected": _selected(runs, measured, contrasts(selection_baselines, budget := _selected_budget(results)), budget),
            "accuracy": _accuracy(runs, measured, paired),
            "provenance": sorted({source(run) for run in results}),
            "same_runs_as": _same_runs_as(label, measured),
        }
    return {"rows": rows, "best_static_at_final_budget": best_static, "best_static_at_best_validation": best_static_selected}


def _seconds_per_step(runs: list[dict]) -> float | None:
    """Mean training seconds per optimizer step (None where a record predates `trained_steps`): a looped model
    computes at every position, so it pays for its depth here."""
    if not all("trained_steps" in run for run in runs):
        return None
    return statistics.fmean(run["train_seconds"] / run["trained_steps"] for run in runs)


def _lowest(labels: list[str], measured: dict[str, dict[int, dict]], loss) -> str | None:
    """The label among `labels` whose runs have the lowest mean `loss(run)` (None when none of them has run, or,
    for a loss measured during training, when some run has no such measurement)."""
    candidates = [label for label in labels if label in measured]
    try:
        return min(candidates, key=lambda label: _ranked(statistics.fmean(loss(run) for run in measured[label].values())), default=None)
    except KeyError:  # runs made without evaluations during training
        return None


def _ranked(loss: float) -> float:
    """A loss to rank by: nan (a diverged run's) ranks last, as inf does, instead of comparing as neither."""
    return math.inf if math.isnan(loss) else loss


def _lowest_validation_loss(run: dict) -> float:
    return min((point["validation_loss"] for point in run["validation_curve"]), key=_ranked)


def _selection_loss(run: dict) -> float:
    return _lowest_validation_loss(run) if run.get("validation_curve") else run["validation_loss"]


def _selected_test_loss(run: dict) -> float:
    """The test loss of the model `_selection_loss` judges."""
    return run["test_loss_at_best_validation"] if run.get("validation_curve") else run["test_loss"]


def accuracy_summary(runs: dict[int, dict]) -> dict | None:
    """On a task: the mean accuracy over hop counts and the accuracy per hop count, each (mean, 95% half-width) over
    seeds; None unless every run has them."""
    if not runs or not all("mean_accuracy" in run for run in runs.values()):
        return None
    hops = sorted(next(iter(runs.values()))["accuracy_by_hops"], key=int)
    return {
        "mean_accuracy": interval([run["mean_accuracy"] for run in runs.values()]),
        "by_hops": {hop: interval([run["accuracy_by_hops"][hop] for run in runs.values()]) for hop in hops},
    }


def _accuracy(runs: dict[int, dict], measured: dict[str, dict[int, dict]], paired: list[tuple[str, str]]) -> dict | None:
    """`accuracy_summary`, and the paired differences of the mean with the rows the loss is `paired` with (name,
    label)."""
    summary = accuracy_summary(runs)
    if summary is None:
        return None
    versus = {
        name: row_difference(runs, measured[other], key="mean_accuracy") for name, other in paired if accuracy_summary(measured[other]) is not None
    }
    return {**summary, "versus": versus}


def _selected(runs: dict[int, dict], measured: dict[str, dict[int, dict]], contrasts: list[tuple[str, str]], budget: str) -> dict | None:
    """The paper's model selection: test loss at each run's best-validation step, and its paired differences with
    the (name, label) baselines of `contrasts` (the best static layout among them the one chosen this way, at the
    distinct blocks of the record field `budget`, `_selected_budget`)."""
    if not all("test_loss_at_best_validation" in run for run in runs.values()):
        return None
    loss, half = interval([run["test_loss_at_best_validation"] for run in runs.values()])
    versus = {
        name: row_difference(runs, measured[other], key="test_loss_at_best_validation")
        for name, other in contrasts
        if all("test_loss_at_best_validation" in run for run in measured[other].values())
    }
    steps = statistics.fmean(run["best_validation_step"] for run in runs.values())
    last = statistics.fmean(run["validation_curve"][-1]["step"] for run in runs.values())  # below max_steps if stopped early
    checked_at = "selected step" if budget == "distinct_at_best_validation" else "final map"
    return {"test_loss": loss, "test_loss_half_width": half, "best_validation_step": steps, "last_step": last, "budget_checked_at": checked_at, "versus": versus}


def _same_budget(runs: dict[int, dict], layout: dict[int, dict], budget: str) -> bool:
    """Whether these runs had the static layout's number of distinct blocks in every seed where they are judged
    (`budget`: `distinct_final`, or `distinct_at_best_validation` for the selected model): only then is a
    comparison with it one at the same budget. A static layout's blocks never change."""
    return all(seed in layout and run[budget] == layout[seed]["distinct_final"] for seed, run in runs.items())


def _selected_budget(runs: list[dict]) -> str:
    """The record field holding the distinct blocks of each run's selected model; the final map's for records made
    before it was recorded (bench/measure.py `model_selection`), which `_selected`'s `budget_checked_at` says."""
    return "distinct_at_best_validation" if all("distinct_at_best_validation" in run for run in runs) else "distinct_final"


def static_candidates(settings: BenchSettings) -> list[str]:
    """The layouts the best static one is chosen from: those at DLT's final U, which DLT's finished runs queue; in
    the recipe presets, which queue no followers, those at the budget itself."""
    where = "U" if settings.recipe_rows else "final U"
    return [f"{layout} @ {where}" for layout in STATIC_LAYOUTS]


PROCESS_PEAK_NAMES = {"cuda_max_memory_allocated": "peak CUDA allocated", "cpu_vm_hwm": "peak RSS", "cpu_max_rss_bytes_macos": "peak RSS"}


def process_peak_name(runs: list[dict]) -> str:
    """What the process-peak column measured: the resident set on a CPU, allocated CUDA memory on a GPU."""
    return " / ".join(sorted({PROCESS_PEAK_NAMES[run["peak_process_kind"]] for run in runs})) or "peak RSS"


def verdict_cell(difference: dict | None) -> str:
    """`markdown_tables.verdict_cell` with, after "no difference detected" in loss, whether the difference is shown
    to lie within the equivalence margin."""
    return _plain_verdict_cell(difference, _equivalence_note(difference or {}))


def write_report(settings: BenchSettings, output: Path, tuning: dict | None = None, report_dir: Path | None = None, markdown=None) -> Path:
    """results.json, results.md and the plots of the runs in `output`, into `report_dir` (default: `output`), every
    strategy at the rate `tuning` chose (`read_learning_rates`; the preset's without). `markdown(settings, payload)`
    writes results.md: by default the study's, or partial loops' (a loop study's is bench/loop_report.py's)."""
    table = collect_study(settings, output, tuning["chosen"] if tuning is not None else None)
    summary = summarise(table, plan_contrasts(settings), static_candidates(settings))
    memory = [result for spec in memory_runs(settings) if (result := _try_load(output, spec)) is not None]
    baselines = json.loads((output / "settings.json").read_text())["baselines"]
    scheduling = {"seeds": list(settings.seeds), "memory_gradient_checkpointing": list(settings.memory_gradient_checkpointing)}
    payload = {
        "settings": json.loads(settings.fingerprint()) | scheduling,
        "learning_rates": tuning,
        "hardware": hardware(_distinct_runs(table) + memory),
        "baselines": baselines,
        **summary,
        "memory": memory,
        "memory_summary": memory_summary(settings, memory),
        "runs": {label: runs for label, runs in table.items()},
    }
    report_dir = output if report_dir is None else report_dir
    report_dir.mkdir(parents=True, exist_ok=True)
    write_whole(report_dir / "results.json", json.dumps(payload, indent=2))
    _plot_quality(summary["rows"], baselines["bigram_test_loss"], report_dir / "quality_vs_distinct.png", by_positions=settings.partial_loops)
    if settings.task is not None:
        _plot_accuracy(summary["rows"], report_dir / "accuracy_by_hops.png")
        _plot_accuracy_by_seed(summary["rows"], table, report_dir / "accuracy_by_seed.png")
    if memory:
        _plot_memory(memory, report_dir / "memory_vs_depth.png")
    if settings.eval_interval:
        _plot_validation(settings, summary, table, report_dir / "validation_over_steps.png")
    report = report_dir / "results.md"
    markdown = markdown or (_partial_loop_markdown if settings.partial_loops else _markdown)
    write_whole(report, markdown(settings, payload))
    return report


def _markdown(settings: BenchSettings, payload: dict) -> str:
    """The study's page (bench/templates/study.md.jinja) from a report's payload."""
    study = _distinct_runs(payload["runs"])
    rows = payload["rows"]
    memory = [run | {"label": f"memory: {_memory_row_name(settings, run)}{', checkpointing' if checkpointed(run) else ''}"} for run in payload["memory"]]
    checked = sorted({row["selected"].get("budget_checked_at", "final map") for row in rows.values() if row["selected"]})
    return render(
        "study.md.jinja",
        **_page_context(settings, payload, study + memory),
        best_static=payload["best_static_at_final_budget"],
        best_static_selected=payload["best_static_at_best_validation"],
        recipe_report=RECIPE_REPORT.relative_to(REPO_ROOT).with_suffix(".md").as_posix(),
        untied=untied_label(settings),
        contrasts=STUDY_CONTRASTS,
        process_peak=process_peak_name(study),
        checked_at_selected_step=checked == ["selected step"],
        verdicts=_verdicts(settings, rows, lambda row: row["versus"], lambda row: (row["accuracy"] or {}).get("versus", {})),
        selected_verdicts=_verdicts(settings, rows, lambda row: (row["selected"] or {}).get("versus", {}), lambda row: {}),
        agent_parts=_agent_parts(payload["runs"].get("dlt", {})),
        memory=payload["memory_summary"],
        memory_peak=process_peak_name(payload["memory"]),
    )


def _page_context(settings: BenchSettings, payload: dict, records: list[dict]) -> dict:
    """What every page of a study's report reads: the settings, the machine, the learning rates, the count bigram, what
    the test split holds, the rows, their accuracy on a task, and where the runs (`records`) came from."""
    return {
        "settings": settings,
        "hardware": payload["hardware"],
        "tuning": payload["learning_rates"],
        "bigram": payload["baselines"]["bigram_test_loss"],
        "coverage": None if settings.task else evaluation_coverage("test", settings.block_size, settings.max_test_blocks),
        "rows": payload["rows"],
        "accuracy": {label: row["accuracy"] for label, row in payload["rows"].items() if row["accuracy"] and row["same_runs_as"] is None},
        "equivalence_note": _equivalence_note,
        "sources": "\n".join(source_lines(records)[1:]),  # less the blank line that opens them: the page has it
    }


def _partial_loop_markdown(settings: BenchSettings, payload: dict) -> str:
    """Presets `partial` and `partial-depth`' page (bench/templates/partial_loops.md.jinja) from a report's payload."""
    context = _page_context(settings, payload, _distinct_runs(payload["runs"]))
    return render("partial_loops.md.jinja", **context, untied=untied_label(settings), contrasts=LOOP_CONTRASTS)


def _verdicts(settings: BenchSettings, rows: dict[str, dict], differences, accuracy_differences) -> list[tuple]:
    """(label, other label, difference, accuracy difference or None) for each contrast that carries a conclusion,
    `differences(row)` giving a row's paired differences in loss and `accuracy_differences(row)` the same in accuracy
    (on a task): the equal-memory model against full depth and the best fixed layout (does depth, and tying, pay?);
    DLT, the paper's agent and the final maps of DLT, random and similarity trained from scratch against every
    baseline (are learned maps better than random ones, and do the maps or the moving between them cost?)."""
    contrasts = {untied_label(settings): ("none", "best static")} | dict.fromkeys(
        ("dlt", "dlt (paper agent)", FINAL_MAP_LABEL, RANDOM_FINAL_MAP_LABEL, SIMILARITY_FINAL_MAP_LABEL)
    )
    if settings.recipe_rows:  # no final maps from scratch: random stands for them, and each tied row meets U blocks
        contrasts |= {"random": None} | {
            spec.label: ("untied U",) for spec in recipe_runs(settings, settings.seeds[0]) if spec.strategy.startswith("static:")
        }
    verdicts = []
    for label, names in contrasts.items():
        if label not in rows:
            continue
        accuracy_versus = accuracy_differences(rows[label])
        for name, difference in differences(rows[label]).items():
            if difference is not None and (names is None or name in names):
                verdicts.append((label, name, difference, accuracy_versus.get(name)))
    return verdicts


def _equivalence_note(difference: dict) -> str:
    if difference.get("verdict") != "no difference detected" or "equivalent_within_margin" not in difference:
        return ""
    shown = "shown" if difference["equivalent_within_margin"] else "not shown"
    return f"; {shown} to be within ±{EQUIVALENCE_MARGIN} nats"


def _same_runs_as(label: str, runs: dict[str, dict[int, dict]]) -> str | None:
    """An earlier label whose runs are this label's, seed for seed (one run serving two labels)."""
    for other in runs:
        if other == label:
            return None
        if runs[other] and runs[other] == runs[label]:
            return other
    return None


def _distinct_runs(table: dict[str, dict[int, dict]]) -> list[dict]:
    """Every run record once, though one run may serve two labels (in every seed or only in some)."""
    unique: dict[tuple, dict] = {}
    for runs in table.values():
        for run in runs.values():
            unique.setdefault((run["label"], run["seed"], run.get("learning_rate")), run)
    return list(unique.values())


def _agent_parts(dlt_runs: dict[int, dict]) -> list[tuple[str, float]]:
    """DLT's agent time by part (deciding, re-tying...), each as its mean share of training time; none without runs."""
    runs = list(dlt_runs.values())
    parts = runs[0]["tying_seconds"].keys() if runs else ()
    return [(part, statistics.fmean(run["tying_seconds"][part] / run["train_seconds"] for run in runs)) for part in parts]


def checkpointed(run: dict) -> bool:
    """Whether a memory run trained with gradient checkpointing (records made before the field existed did not)."""
    return run.get("gradient_checkpointing", False)


# What the keys of `memory_summary` measured with gradient checkpointing end with (those without: nothing).
CHECKPOINTING_SUFFIX = "_checkpointing"


def _memory_row_name(settings: BenchSettings, run: dict) -> str:
    """`none, 48 blocks`, `dlt, 48 blocks`, or `untied, 8 blocks` for the model as deep as the budget."""
    untied = run["num_blocks"] not in settings.memory_depths
    return f"{'untied' if untied else run['strategy']}, {run['num_blocks']} blocks"


def memory_summary(settings: BenchSettings, memory: list[dict]) -> dict[str, dict]:
    """One row per model of the memory runs (`_memory_row_name`), in the plan's order: its training state and process
    peak in MiB, its distinct blocks at the peak and the re-tie time, without gradient checkpointing and with it (keys
    ending `CHECKPOINTING_SUFFIX`); each model's state and peak over conventional training's at its depth (the untied
    model's: at the deepest) in the same mode; and its peak with checkpointing over its peak without. What was not
    measured is absent (a blank cell)."""
    by_name: dict[str, dict[bool, dict]] = {}
    for run in memory:
        by_name.setdefault(_memory_row_name(settings, run), {})[checkpointed(run)] = run
    rows = {}
    for name, modes in by_name.items():
        depth = next(iter(modes.values()))["num_blocks"]
        reference = by_name.get(f"none, {depth if depth in settings.memory_depths else max(settings.memory_depths)} blocks", {})
        row = {"blocks": depth}
        for run in modes.values():
            suffix = CHECKPOINTING_SUFFIX if checkpointed(run) else ""
            row |= {
                f"peak_state_mib{suffix}": run["peak_state_bytes"] / MIB,
                f"peak_process_mib{suffix}": run["peak_process_bytes"] / MIB,
                f"distinct_peak{suffix}": run["distinct_peak"],
                f"retie_ms{suffix}": run["retie_ms"],
            }
            conventional = reference.get(checkpointed(run))
            if conventional is not None and conventional is not run:
                row[f"state_over_none{suffix}"] = run["peak_state_bytes"] / conventional["peak_state_bytes"]
                row[f"process_over_none{suffix}"] = run["peak_process_bytes"] / conventional["peak_process_bytes"]
        if len(modes) == 2:
            row["process_checkpointing_over_without"] = modes[True]["peak_process_bytes"] / modes[False]["peak_process_bytes"]
        rows[name] = row
    return rows


def _plot_quality(rows: dict[str, dict], bigram: float | None, path: Path, by_positions: bool = False) -> None:
    """Test loss with its interval against the blocks that owned weights on average, one marker per strategy (a
    label whose runs are another's is left out); strategies at the same budget are spread a little sideways. The
    legend stands beside the axes, so that it hides no point (12 untied blocks sit at the right edge), and each of up
    to 20 strategies gets its own colour. Each run's loss is that of the model it selects (its best-validation step
    under model selection, its last step without), the loss the report's tables lead with. `by_positions`: against
    the positions the blocks are applied at instead (preset `partial`, every row at the same distinct blocks)."""
    shown = [label for label in rows if rows[label]["same_runs_as"] is None]
    figure, axes = plt.subplots(figsize=(10, 5))
    at_budget: dict[float, int] = {}
    for index, label in enumerate(shown):
        row = rows[label]
        quality = row["selected"] or row
        x = row["positions"] if by_positions else row["distinct_mean"]
        budget = round(x, 1)
        earlier = at_budget.get(budget, 0)  # markers already drawn at this budget
        at_budget[budget] = earlier + 1
        offset = 0.12 * earlier
        half = 0 if math.isnan(quality["test_loss_half_width"]) else quality["test_loss_half_width"]
        axes.errorbar(
            x + offset, quality["test_loss"], yerr=half, capsize=4, label=label,
            fmt="os^vDP*Xph"[index % 10], color=plt.get_cmap("tab20")(index % 20),
        )  # fmt: skip
    if bigram is not None:
        axes.axhline(bigram, color="grey", linestyle="--", label=f"count bigram ({bigram:.3f})")
    axes.set_xlabel("positions (blocks applied per forward pass)" if by_positions else "distinct blocks, mean over training steps")
    axes.set_ylabel("test loss of the selected model (nats/token),\nmean ± 95% interval")
    axes.set_title("Quality against the positions, every row at the same distinct blocks (lower is better)" if by_positions else "Quality against the blocks that own weights (lower is better)")
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _plot_accuracy(rows: dict[str, dict], path: Path) -> None:
    """Test accuracy against hop count with its interval, one line per strategy (a label whose runs are another's
    is left out)."""
    shown = [label for label, row in rows.items() if row["accuracy"] and row["same_runs_as"] is None]
    if not shown:  # no study run has finished yet
        return
    figure, axes = plt.subplots(figsize=(8, 5))
    for index, label in enumerate(shown):
        by_hops = rows[label]["accuracy"]["by_hops"]
        hops = [int(hop) for hop in by_hops]
        halves = [0 if math.isnan(half) else half for _, half in by_hops.values()]
        axes.errorbar(
            [hop + 0.03 * (index - len(shown) / 2) for hop in hops], [mean for mean, _ in by_hops.values()], yerr=halves,
            capsize=3, marker="os^vDP*Xph"[index % 10], color=plt.get_cmap("tab20")(index % 20), label=label,
        )  # fmt: skip
    axes.set_xticks(hops)
    axes.set_ylim(-0.02, 1.02)  # an interval of few seeds reaching past what accuracy can be runs off the axes
    axes.set_xlabel("hops")
    axes.set_ylabel("test accuracy, mean ± 95% interval")
    axes.set_title("Accuracy per hop count (higher is better)")
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _plot_accuracy_by_seed(rows: dict[str, dict], table: dict[str, dict[int, dict]], path: Path) -> None:
    """Each seed's mean test accuracy over hop counts, a dot per seed (one colour per seed, across strategies), and
    each strategy's mean as a bar: where some seeds train and others sink, a mean and its interval hide the risk a
    user takes on one run, and which seeds sink together."""
    shown = [label for label, row in rows.items() if row["accuracy"] and row["same_runs_as"] is None]
    if not shown:  # no study run has finished yet
        return
    seeds = sorted({seed for label in shown for seed in table[label]})
    figure, axes = plt.subplots(figsize=(8, 1.5 + 0.45 * len(shown)))
    for index, seed in enumerate(seeds):
        offset = 0.5 * (index / max(len(seeds) - 1, 1) - 0.5)  # each seed at its own height within a row
        points = [(table[label][seed]["mean_accuracy"], row + offset) for row, label in enumerate(shown) if seed in table[label]]
        axes.scatter(*zip(*points), s=16, color=plt.get_cmap("tab10")(index % 10), label=f"seed {seed}", zorder=3)
    for row, label in enumerate(shown):
        mean = rows[label]["accuracy"]["mean_accuracy"][0]
        axes.plot([mean, mean], [row - 0.35, row + 0.35], color="black", linewidth=2)
    axes.set_yticks(range(len(shown)), shown)
    axes.invert_yaxis()
    axes.set_xlim(-0.02, 1.02)
    axes.set_xlabel("test accuracy, mean over hop counts (bar: mean over seeds)")
    axes.set_title("Accuracy of every seed (higher is better)")
    axes.grid(axis="x", alpha=0.3)
    axes.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _plot_validation(settings: BenchSettings, summary: dict, table: dict[str, dict[int, dict]], path: Path) -> None:
    """Left: validation loss over steps, mean over seeds, for the strategies behind the main contrasts (the best
    static layout under model selection among them), each curve's lowest point marked: where each starts to
    overfit. Right: every strategy's test loss at its best-validation step (the paper's model selection) beside its
    last step's, with their intervals: what training past the minimum costs each strategy."""
    rows = summary["rows"]
    shown = [label for label in rows if rows[label]["selected"] is not None and rows[label]["same_runs_as"] is None]
    if not shown:  # no study run has finished yet
        return
    main = {spec.label for spec in core_runs(settings, settings.seeds[0])} | {summary["best_static_at_best_validation"]}
    figure, (curves_axes, selection_axes) = plt.subplots(1, 2, figsize=(14, 5.5), width_ratios=(3, 2))
    for index, label in enumerate(label for label in shown if label in main):
        curves = [{point["step"]: point["validation_loss"] for point in run["validation_curve"]} for run in table[label].values()]
        steps = sorted(set.intersection(*(set(curve) for curve in curves)))  # runs stopped early end at different steps
        means = [statistics.fmean(curve[step] for curve in curves) for step in steps]
        colour = plt.get_cmap("tab10")(index % 10)
        curves_axes.plot(steps, means, label=f"{label} ({seeds_text(len(curves))})", color=colour)
        lowest = min(range(len(steps)), key=means.__getitem__)
        curves_axes.plot(steps[lowest], means[lowest], marker="o", color=colour)
    curves_axes.set_xlabel("optimizer step")
    curves_axes.set_ylabel("validation loss (nats/token), mean over seeds")
    curves_axes.set_title("Validation loss over training (dot: the mean curve's lowest point;\na curve ends where its earliest-stopped seed stopped)")
    curves_axes.legend(fontsize=8, loc="best")
    ordered = sorted(shown, key=lambda label: rows[label]["selected"]["test_loss"], reverse=True)
    for position, label in enumerate(ordered):
        row, selected = rows[label], rows[label]["selected"]
        at_best = (selected["test_loss"], selected["test_loss_half_width"])
        at_last = (row["test_loss"], row["test_loss_half_width"])
        selection_axes.plot([at_best[0], at_last[0]], [position, position], color="lightgrey", zorder=1)
        for (mean, half), marker, colour in ((at_best, "o", "black"), (at_last, "s", "darkgrey")):
            selection_axes.errorbar(mean, position, xerr=0 if math.isnan(half) else half, fmt=marker, color=colour, capsize=3)
    selection_axes.set_yticks(range(len(ordered)), [f"{label} ({len(rows[label]['seeds'])})" for label in ordered], fontsize=8)
    selection_axes.set_xlabel("test loss (nats/token), mean ± 95% interval")
    selection_axes.set_title("Test loss at the best-validation step (black dot)\nand at the last step (grey square); (seeds)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _plot_memory(memory: list[dict], path: Path) -> None:
    """Training state and process peak against depth, for conventional training and DLT under its cap, without
    gradient checkpointing and, dashed, with it (log scale)."""
    peak = process_peak_name(memory)
    figure, axes = plt.subplots(figsize=(9, 4.5))
    for strategy, marker, colour in (("none", "o", "black"), ("dlt", "s", "tab:red")):
        for checkpointing, state_style, peak_style in ((False, "-", ":"), (True, "--", "-.")):
            runs = sorted((run for run in memory if run["strategy"] == strategy and checkpointed(run) == checkpointing), key=lambda run: run["num_blocks"])
            if not runs:
                continue
            depths, mode = [run["num_blocks"] for run in runs], ", checkpointing" if checkpointing else ""
            for key, style, what in (("peak_state_bytes", state_style, "training state"), ("peak_process_bytes", peak_style, peak)):
                values = [run[key] / MIB for run in runs]
                axes.plot(depths, values, marker=marker, color=colour, linestyle=style, label=f"{strategy}: {what}{mode}")
    axes.set_xlabel("blocks")
    axes.set_ylabel("peak memory (MiB)")
    axes.set_yscale("log")
    axes.set_title("Peak memory over the run against depth")
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: it hides no point
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
