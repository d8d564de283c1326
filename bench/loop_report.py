"""The report of one task of the pre-registered loop study (presets `loops-*`, bench/loop_study.py): every row's
score with its paired differences from U and 2U untied blocks, from the same layout alone and from the same layout
under the whole recipe, then the contrasts that decide each hypothesis, listed under it as the pre-registration
words it. Verdicts are the intervals'; the report judges nothing the file did not fix in advance."""

from __future__ import annotations

import statistics

from .loop_study import read_preregistration
from .markdown_tables import estimate, verdict_cell
from .provenance import source_lines
from .report import EQUIVALENCE_MARGIN, _data_words, _distinct_runs, _length_words, _recipe_words, _test_loss_words
from .settings import BenchSettings

# Contrast name (bench/loop_study.py's `versus`, and `untied U` from the report's baselines) -> column header.
LOOP_STUDY_CONTRASTS = {
    "untied U": "vs untied U",
    "untied 2U": "vs untied 2U",
    "layout alone": "vs the layout alone",
    "whole recipe": "vs the layout under the recipe",
}


def loop_study_markdown(settings: BenchSettings, payload: dict) -> str:
    registration = read_preregistration()
    plan = registration["tasks"][settings.loop_study]
    if registration["margin_nats"] != EQUIVALENCE_MARGIN:
        raise ValueError(f"the pre-registered margin {registration['margin_nats']} is not the reports' {EQUIVALENCE_MARGIN}")
    rows, records = payload["rows"], _distinct_runs(payload["runs"])
    on_accuracy = plan["metric"] == "mean_accuracy"

    def measure(row: dict) -> dict:
        """The pre-registered metric's summary and paired differences for a row."""
        if on_accuracy:
            return {"value": row["accuracy"]["mean_accuracy"], "versus": row["accuracy"]["versus"]} if row["accuracy"] else {}
        return {"value": (row["test_loss"], row["test_loss_half_width"]), "versus": row["versus"]}

    metric = "mean test accuracy" if on_accuracy else "test loss"
    lines = [
        f"Task `{settings.loop_study}` of the pre-registered loop study ({_registration_words(settings, records)}). "
        f"Model: TiedGPT2 of width {settings.n_embd} ({settings.n_head} heads), context {settings.block_size}, "
        f"{_data_words(settings)}; {_length_words(settings)}, {_recipe_words(settings, payload['learning_rates'])}. "
        f"U = {settings.max_distinct_blocks} distinct blocks in every looped row, the state of `untied, "
        f"{settings.max_distinct_blocks} blocks`; DLT decides every {settings.tying_interval} steps under that budget, "
        "under every part of the recipe but the adapters (a moving map cannot hold them). "
        f"Hardware: {payload['hardware']}.",
        "",
        (
            "Mean test accuracy over " + ("hop counts" if settings.task.startswith("hop") else "positions")
            + ", mean ± 95% interval over the row's seeds; differences are paired on the seeds both rows have "
            "(positive: more accurate than the other). "
            if on_accuracy
            else _test_loss_words(settings, payload["baselines"]["bigram_test_loss"])
        )
        + "s per step: training seconds over optimizer steps, mean over seeds, two runs side by side.",
        "",
        f"| row | seeds | {metric} | {' | '.join(LOOP_STUDY_CONTRASTS.values())} | positions | s per step |",
        "|---|---|---|" + "---|" * len(LOOP_STUDY_CONTRASTS) + "---|---|",
    ]
    for label, row in rows.items():
        scored = measure(row)
        if not scored:
            continue
        versus = " | ".join(verdict_cell(scored["versus"].get(name)) for name in LOOP_STUDY_CONTRASTS)
        per_step = row["seconds_per_step"]
        lines.append(
            f"| {label} | {len(row['seeds'])} | {estimate(*scored['value'])} | {versus} | {row['positions']:.0f} "
            f"| {'' if per_step is None else f'{per_step:.3f}'} |"
        )
    lines += _hypothesis_lines(registration, settings, payload, measure)
    lines += source_lines(records)
    return "\n".join(lines) + "\n"


def _registration_words(settings: BenchSettings, records: list[dict]) -> str:
    """The pre-registration's file and digest, and the commit each record found it committed in when it started."""
    commits = sorted({record.get("preregistration_commit", "none recorded") for record in records})
    found = f"; the runs found it committed in {', '.join(commits)} when they started" if records else ""
    return f"pre-registration bench/preregistration/looped-models.json, digest {settings.preregistration_digest}{found}"


# Which contrasts of a row bear on each hypothesis: label -> the contrast names (none: the row does not). H1-H3 are
# the depth tasks', H7 language's, H4-H6 every task's; H6's fixed layout is chosen on validation (`_better_under_recipe`).
PARTS = ("rate", "residual", "injection", "adapters")
HYPOTHESIS_CONTRASTS = {
    "H1": lambda label: ("untied U",) if label == "0 1 1 1" else (),
    "H2": lambda label: ("layout alone",) if label.startswith("cycle:") and label.endswith("positions + recipe") else (),
    "H3": lambda label: ("untied 2U",) if _layout_under_whole_recipe(label) else (),
    "H4": lambda label: ("layout alone", "whole recipe") if label.endswith(tuple(f" + {part}" for part in PARTS)) else (),
    "H5": lambda label: ("layout alone",) if label.endswith(" + onset") else ("whole recipe",) if label.endswith(" + onset + recipe") else (),
    "H7": lambda label: ("untied U",) if not label.startswith(("untied", "dlt")) else (),
}
DEPTH_ONLY, LANGUAGE_ONLY = ("H1", "H2", "H3"), ("H7",)


def _hypothesis_lines(registration: dict, settings: BenchSettings, payload: dict, measure) -> list[str]:
    """Each hypothesis as registered, then the paired differences that bear on it on this task."""
    rows = payload["rows"]
    language = registration["tasks"][settings.loop_study]["metric"] == "test_loss"
    lines = ["", "The hypotheses as registered, each with the contrasts of this task that bear on it:", ""]
    for key, words in registration["hypotheses"].items():
        number = key.split()[0]
        if number in (DEPTH_ONLY if language else LANGUAGE_ONLY):
            continue
        lines.append(f"- **{key}**: {words}")
        if number == "H6":
            lines += _learned_map_lines(payload, measure, language)
            continue
        for label, row in rows.items():
            scored = measure(row)
            for name in HYPOTHESIS_CONTRASTS[number](label) if scored else ():
                if (difference := scored["versus"].get(name)) is not None:
                    lines.append(f"  - {label} vs {_contrast_words(name, settings)}: {verdict_cell(difference, _margin_note(difference))}")
    return lines


def _learned_map_lines(payload: dict, measure, language: bool) -> list[str]:
    """H6: DLT under the recipe (every part but the adapters, which a moving map cannot hold) against the fixed
    layout under the whole recipe of best mean validation score."""
    dlt = payload["rows"].get("dlt + recipe")
    better = _better_under_recipe(payload["runs"], language)
    difference = measure(dlt)["versus"].get(better) if dlt and better and measure(dlt) else None
    if difference is None:
        return []
    return [f"  - dlt + recipe (no adapters) vs {better}, the better fixed layout under the recipe on validation: {verdict_cell(difference, _margin_note(difference))}"]


def _better_under_recipe(runs: dict[str, dict[int, dict]], language: bool) -> str | None:
    """Of the layouts under the whole recipe, the one of best mean validation score (loss for language, accuracy
    for a depth task): the test split plays no part in the choice."""
    candidates = {label: by_seed for label, by_seed in runs.items() if _layout_under_whole_recipe(label)}
    scored = {
        label: statistics.fmean(run["validation_loss"] if language else -run["validation_mean_accuracy"] for run in by_seed.values())
        for label, by_seed in candidates.items() if by_seed
    }  # fmt: skip
    return min(scored, key=scored.get) if scored else None


def _layout_under_whole_recipe(label: str) -> bool:
    """A fixed layout under the whole recipe, without the onset (bench/loop_study.py's labels)."""
    return label.endswith(" + recipe") and " + onset" not in label and label != "dlt + recipe"


def _contrast_words(name: str, settings: BenchSettings) -> str:
    budget = settings.max_distinct_blocks
    return {
        "untied U": f"{budget} untied blocks",
        "untied 2U": f"{2 * budget} untied blocks",
        "layout alone": "the same layout alone",
        "whole recipe": "the same layout under the whole recipe",
    }.get(name, name)


def _margin_note(difference: dict) -> str:
    """A loss difference's equivalence test against the margin, whatever its verdict (a difference detected may still
    lie within the margin)."""
    if "equivalent_within_margin" not in difference:
        return ""
    return f"; {'shown' if difference['equivalent_within_margin'] else 'not shown'} to be within ±{EQUIVALENCE_MARGIN} nats"

