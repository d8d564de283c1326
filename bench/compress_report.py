"""The report of `bench/compress.py`: one record per run, and per row its mean test loss with a 95% t-interval and
its paired differences (by seed) to the best way of getting a small model without tying at the same memory, chosen on
validation loss among the rows that compete for it (`Row.trains_small`: untied blocks from scratch or cut from the
teacher, distilled or not): the best of them all, and the best of those trained for the row's own steps
(`Row.steps`), which is what a user holding the trained model and spending the uptraining's steps compares with."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .compress_settings import PRESETS, UPTRAINING_STEPS, CompressSettings, Row, row_dir  # noqa: E402
from .markdown_tables import MIB  # noqa: E402
from .provenance import source_lines  # noqa: E402
from .report import accuracy_summary, interval, paired_difference, process_peak_name, verdict_cell  # noqa: E402
from .scheduling import write_whole  # noqa: E402
from .templates import render  # noqa: E402

COLUMN_NAMES = {"best_small": "vs best small", "best_small_same_steps": "same steps"}  # the report's columns


def collect(rows: list[Row], seeds: tuple[int, ...], output: Path) -> dict[str, dict[int, dict]]:
    """label -> seed -> result, for every finished run; a record from before rows could distil gets `distill`
    None (it did not)."""
    table = {}
    for row in rows:
        table[row.label] = {}
        for seed in seeds:
            path = row_dir(output, row, seed) / "result.json"
            if path.is_file():
                table[row.label][seed] = {"distill": None, **json.loads(path.read_text())}
    return table


def summarise(rows: list[Row], table: dict[str, dict[int, dict]], seeds: tuple[int, ...] | None = None) -> dict:
    """Per row: its test loss and memory, and its paired differences to the best "train small" row of its family,
    of all and of the row's own steps (`best_small`, `best_small_by_steps`); and per family the rows that competed
    (`small_candidates`) and those that could but have not finished (`small_not_competing`); the rows with no
    finished run (`not_run`). With `seeds` (the
    preset's), only rows finished on every seed they run compete, while any has."""
    families = list(dict.fromkeys(row.model_type for row in rows))
    candidates = {family: _small_candidates(rows, table, family, seeds) for family in families}
    best_small = {family: _best_small(table, candidates[family]) for family in families}
    steps_of = {row.label: row.steps for row in rows}
    best_small_by_steps = {
        family: {steps: _best_small(table, [label for label in candidates[family] if steps_of[label] == steps]) for steps in dict.fromkeys(steps_of.values())}
        for family in families
    }
    waiting = {family: [row.label for row in rows if row.trains_small and row.model_type == family and row.label not in candidates[family]] for family in families}
    summary = {}
    for row in rows:
        runs = table[row.label]
        if not runs:
            continue
        small_labels = candidates[row.model_type]
        preferred = {"best_small": best_small[row.model_type], "best_small_same_steps": best_small_by_steps[row.model_type][row.steps]}
        baseline = _one_teacher_baseline(table, row.label, preferred["best_small"], small_labels)
        same_steps = _one_teacher_baseline(table, row.label, preferred["best_small_same_steps"], [label for label in small_labels if steps_of[label] == row.steps])
        paired_with = {"best_small": baseline, "best_small_same_steps": same_steps}
        undistilled = _undistilled_twin(row, rows) if row.distill else None
        loss, half = interval([run["test_loss"] for run in runs.values()])
        summary[row.label] = {
            "seeds": sorted(runs),
            "test_loss": loss,
            "test_loss_half_width": half,
            "distinct_peak": max(run["distinct_peak"] for run in runs.values()),
            "peak_state_mib": statistics.fmean(run["peak_state_bytes"] for run in runs.values()) / MIB,
            "peak_process_mib": statistics.fmean(run["peak_process_bytes"] for run in runs.values()) / MIB,
            "train_seconds": statistics.fmean(run["train_seconds"] for run in runs.values()),
            "paired_with": paired_with,
            # by the report's column: the baselines that differ from the family's, the row having read another teacher
            "paired_instead_with": {COLUMN_NAMES[key]: label for key, label in paired_with.items() if label not in (None, preferred[key])},
            "versus_best_small": _paired(runs, table, baseline),
            "versus_best_small_same_steps": _paired(runs, table, same_steps),
            # a distilled row minus the same row undistilled, on the seeds where both read one teacher
            "versus_undistilled": _paired(runs, table, undistilled),
            "export_logit_difference": max((run["export_logit_difference"] for run in runs.values() if "export_logit_difference" in run), default=math.nan),
            **_accuracy(runs, table, baseline, same_steps, undistilled),
        }
    return {
        "best_small": best_small,
        "best_small_by_steps": best_small_by_steps,
        "small_candidates": candidates,
        "small_not_competing": waiting,
        "rows": summary,
        "not_run": [row.label for row in rows if not table[row.label]],  # no finished run: no line in the table
    }


def _one_teacher_baseline(table: dict[str, dict[int, dict]], label: str, best: str | None, candidates: list[str]) -> str | None:
    """The baseline `label` is paired with: `best`, unless the row is `best` itself (None) or, sharing seeds with it,
    pairs with it on none (`_pairable_seeds`: on each seed they share, one of them read another teacher); then, of the
    other `candidates`, the best of those it pairs with on the most seeds, where it pairs with any. The report names
    the baseline where it is not `best`."""
    if best is None or best == label:
        return None
    runs = table[label]
    if _pairable_seeds(runs, table[best]) or not runs.keys() & table[best].keys():
        return best  # paired on the seeds they share, or on none: sharing no seed is no other teacher
    pairs = {other: len(_pairable_seeds(runs, table[other])) for other in candidates if other != label}
    most = max(pairs.values(), default=0)
    return _best_small(table, [other for other, count in pairs.items() if count == most]) if most else best


def _pairable_seeds(runs: dict[int, dict], others: dict[int, dict]) -> list[int]:
    """The seeds both have where the two runs read one teacher (`_one_teacher`)."""
    return [seed for seed, run in runs.items() if seed in others and _one_teacher(run, others[seed])]


def _paired(runs: dict[int, dict], table: dict[str, dict[int, dict]], baseline: str | None, key: str = "test_loss") -> dict | None:
    """`runs` paired by seed with the baseline's runs on `key`, on the seeds where both read one teacher
    (`_one_teacher`); the row's seeds left out, for reading another or for lacking the baseline's run, are counted in
    `left_out` (`left_out_why` says which). None without a baseline, one with no run yet, or
    where it lacks `key` (a row run before accuracy was recorded)."""
    if baseline is None or not table[baseline] or not all(key in run for run in table[baseline].values()):
        return None
    others = table[baseline]
    pairable = {seed: runs[seed] for seed in _pairable_seeds(runs, others)}
    other_teacher = len(runs.keys() & others.keys()) - len(pairable)
    absent = len(runs.keys() - others.keys())  # mid-study, a baseline not finished on every seed yet
    reasons = [why for why, count in (("another teacher", other_teacher), ("absent from the baseline", absent)) if count]
    difference = paired_difference(pairable, others, key=key) or {}
    if not reasons:
        return difference or None
    return difference | {"left_out": other_teacher + absent, "left_out_why": " or ".join(reasons)}


def _one_teacher(run: dict, other: dict) -> bool:
    """Whether two runs of a seed may be paired: either read no teacher, or both read the same one. A teacher is
    named by its test loss (`teacher_test_loss`): its weights stay out of git, so a seed's teacher is trained again
    on a fresh machine, and one trained again by later code measures differently (by up to 0.03 nats here), while the
    same code trains it again bit-identical (checked on seed 1's language-modeling teacher); the same teacher, read
    twice, measures the same to the last digit. (Records made before the loss-count fix hold their
    teacher's loss multiplied by 64/63 (`bench.provenance.CORRECTION_FIELD`), as the teachers' own files do not; no teacher
    trained before that fix is left to be read again.)"""
    mine, theirs = run.get("teacher_test_loss"), other.get("teacher_test_loss")
    return mine is None or theirs is None or mine == theirs


def _undistilled_twin(row: Row, rows: list[Row]) -> str | None:
    """The label of the row that differs from `row` only in not distilling, where the plan has one."""
    key = dataclasses.replace(row, label="", distill=False)
    return next((other.label for other in rows if not other.distill and dataclasses.replace(other, label="") == key), None)


def _accuracy(runs: dict[int, dict], table: dict[str, dict[int, dict]], baseline: str | None, same_steps: str | None, undistilled: str | None) -> dict:
    """On a task: `accuracy_summary`, and the mean's paired differences to the best small rows and, for a distilled
    row, to its undistilled twin."""
    summary = accuracy_summary(runs)
    if summary is None:
        return {}
    return {
        "mean_accuracy": summary["mean_accuracy"],
        "accuracy_by_hops": summary["by_hops"],
        "accuracy_versus_best_small": _paired(runs, table, baseline, key="mean_accuracy"),
        "accuracy_versus_best_small_same_steps": _paired(runs, table, same_steps, key="mean_accuracy"),
        "accuracy_versus_undistilled": _paired(runs, table, undistilled, key="mean_accuracy"),
    }


def _small_candidates(rows: list[Row], table: dict[str, dict[int, dict]], family: str, seeds: tuple[int, ...] | None) -> list[str]:
    """The family's rows that compete for "best small" (`Row.trains_small`) and have runs; with `seeds`, those
    finished on every seed they run, while any is (means over different seeds would not compare)."""
    small = [row for row in rows if row.trains_small and row.model_type == family and table[row.label]]
    if seeds is not None:
        complete = [row for row in small if set(table[row.label]) >= set(row.seeds or seeds)]
        small = complete or small
    return [row.label for row in small]


def _best_small(table: dict[str, dict[int, dict]], candidates: list[str]) -> str | None:
    """The best of the candidates at the same memory, on mean validation loss (not on the test): what a user
    choosing among them would pick."""
    return min(candidates, key=lambda label: statistics.fmean(run["validation_loss"] for run in table[label].values()), default=None)


def write_report(settings: CompressSettings, rows: list[Row], output: Path, report_dir: Path) -> Path:
    """results.json (the summary and every record), results.md and results.png of the finished runs in `output`, into
    `report_dir`; returns the Markdown's path."""
    table = collect(rows, settings.seeds, output)
    summary = summarise(rows, table, settings.seeds)
    records = [run for label in table for run in table[label].values()]
    report_dir.mkdir(parents=True, exist_ok=True)
    payload = {"settings": json.loads(settings.fingerprint()), "seeds": list(settings.seeds), **summary, "records": records}
    write_whole(report_dir / "results.json", json.dumps(payload, indent=2))
    write_whole(report_dir / "results.md", _markdown(settings, summary, records))
    _plot(rows, summary, report_dir / "results.png")
    return report_dir / "results.md"


def _plot(plan_rows: list[Row], summary: dict, path: Path) -> None:
    """Each row's quality (mean accuracy on a task, else test loss) with its 95% interval, coloured by its training
    state, and across each family's rows its best small row's value, of all and of the uptraining's steps: what beats
    training small at the same memory, and at the same steps.
    A row of one seed has no interval and says so; its family gets no line (one seed compares nothing). A row that
    read another teacher than its family's baseline is compared with another baseline (`paired_instead_with`), not
    with the lines, and says so."""
    rows = summary["rows"]
    on_task = all("mean_accuracy" in row for row in rows.values())
    labels = list(rows)
    names = [
        label + (" (1 seed)" if len(rows[label]["seeds"]) == 1 else "") + (" (paired with another baseline)" if rows[label].get("paired_instead_with") else "")
        for label in labels
    ]
    values = [rows[label]["mean_accuracy"] if on_task else (rows[label]["test_loss"], rows[label]["test_loss_half_width"]) for label in labels]
    states = sorted({round(rows[label]["peak_state_mib"], 2) for label in labels})
    colours = {state: plt.get_cmap("viridis")(index / max(1, len(states) - 1)) for index, state in enumerate(states)}
    figure, axes = plt.subplots(figsize=(9, 0.32 * len(labels) + 1.5))
    for index, (label, (mean, half)) in enumerate(zip(labels, values)):
        colour = colours[round(rows[label]["peak_state_mib"], 2)]
        axes.errorbar(mean, index, xerr=0 if math.isnan(half) else half, fmt="o", color=colour, capsize=3)
    for state, colour in colours.items():
        axes.plot([], [], "o", color=colour, label=f"{state:.2f} MiB of training state")
    for family, best in summary["best_small"].items():
        span = [labels.index(row.label) for row in plan_rows if row.model_type == family and row.label in rows]
        uptraining = summary["best_small_by_steps"][family].get(UPTRAINING_STEPS)
        for label, style in ((best, "--"), (uptraining, ":")):
            if label in rows and len(rows[label]["seeds"]) > 1 and (style == "--" or label != best):
                axes.vlines(values[labels.index(label)][0], min(span) - 0.4, max(span) + 0.4, color="grey", linestyle=style, linewidth=1)
    axes.set_yticks(range(len(labels)), names, fontsize=7)
    axes.invert_yaxis()
    axes.set_xlabel(("test accuracy, mean over hop counts" if on_task else "test loss (nats/token)") + ", mean ± 95% interval")
    better = "higher" if on_task else "lower"
    axes.set_title(
        f"Compressing a trained model ({better} is better)\nthe best small row: dashed, of all; dotted, of the uptraining's steps",
        fontsize=9,
    )
    axes.legend(fontsize=7, loc="best")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _command(settings: CompressSettings) -> str:
    """The command that reruns these settings: the preset they are, with `--task` where they take another task; the
    settings themselves are spelled out beside it."""
    for name, preset in PRESETS.items():
        if dataclasses.replace(preset, task=settings.task).fingerprint() == settings.fingerprint():
            task = "" if settings.task == preset.task else f" --task '{settings.task}'"
            return "python bench/compress.py" + ("" if name == "default" else f" --preset {name}") + task
    return "python bench/compress.py"


def _markdown(settings: CompressSettings, summary: dict, records: list[dict]) -> str:
    """The compression study's page (bench/templates/compress.md.jinja)."""
    teachers: dict[tuple[str, int], list[float]] = {}  # a seed's teacher losses, in the order the rows read them
    for run in records:
        if run.get("teacher_test_loss") is not None:
            losses = teachers.setdefault((run.get("model_type", "tied_gpt2").removeprefix("tied_"), run["seed"]), [])
            losses += [] if run["teacher_test_loss"] in losses else [run["teacher_test_loss"]]
    # The distilled rows' settings and the teacher memory they hold beside their training state.
    distilled_runs = [run for run in records if run.get("distill")]
    distilled = {label: row for label, row in summary["rows"].items() if row.get("versus_undistilled") is not None}
    return render(
        "compress.md.jinja",
        settings=settings,
        command=_command(settings),
        fingerprint=json.dumps(json.loads(settings.fingerprint())),
        distill_settings=sorted({(run["distill"]["temperature"], run["distill"]["alpha"]) for run in distilled_runs}),
        teacher_mib=sorted({round(run["teacher_parameters_mib"], 2) for run in distilled_runs if run.get("teacher_parameters_mib") is not None}),
        process_peak=process_peak_name(records),
        summary=summary,
        teachers=sorted(teachers.items()),
        retrained=any(len(losses) > 1 for losses in teachers.values()),
        accuracy={label: row for label, row in summary["rows"].items() if "mean_accuracy" in row},
        distilled=distilled,
        on_task=any("accuracy_versus_undistilled" in row for row in distilled.values()),
        versus_cell=_versus_cell,
        export_cell=_export_cell,
        verdict_cell=verdict_cell,
        sources="\n".join(source_lines(records)[1:]),  # less the blank line that opens them: the page has it
    )


def _versus_cell(row: dict, key: str, prefix: str = "") -> str:
    """A paired difference against the baseline `key` names, and that baseline's label where it is not the
    family's (the row read another teacher than the family's baseline)."""
    cell = verdict_cell(row.get(f"{prefix}versus_{key}"))
    substitute = row.get("paired_instead_with", {}).get(COLUMN_NAMES[key])
    return f"{cell}, against {substitute} (the family's baseline read another teacher)" if substitute and cell else cell


def _export_cell(difference: float) -> str:
    return "" if math.isnan(difference) else f"{difference:.1e}"
