"""The report of one task of the pre-registered loop study (presets `loops-*`, bench/loop_study.py): every row's
score with its paired differences from U and 2U untied blocks, from the same layout alone and from the same layout
under the whole recipe, then the contrasts that decide each hypothesis, listed under it as the pre-registration
words it. Verdicts are the intervals'; the report judges nothing the file did not fix in advance."""

from __future__ import annotations

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
        f"{settings.max_distinct_blocks} blocks`; DLT decides every {settings.tying_interval} steps under that budget. "
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
    lines += _hypothesis_lines(registration, settings, rows, measure)
    lines += source_lines(records)
    return "\n".join(lines) + "\n"


def _registration_words(settings: BenchSettings, records: list[dict]) -> str:
    """The pre-registration's file and digest, and the commit each record found it committed in when it started."""
    commits = sorted({record.get("preregistration_commit", "none recorded") for record in records})
    found = f"; the runs found it committed in {', '.join(commits)} when they started" if records else ""
    return f"pre-registration bench/preregistration/looped-models.json, digest {settings.preregistration_digest}{found}"


# Which rows' contrasts bear on each hypothesis (by its key's first word): (row filter, contrast names).
HYPOTHESIS_CONTRASTS = {
    "H1": (lambda label: label == "0 1 1 1", ("untied U",)),
    "H2": (lambda label: label.startswith("cycle:") and label.endswith(" + recipe") and "onset" not in label, ("layout alone",)),
    "H3": (lambda label: label.endswith(" + recipe") and "onset" not in label and not label.startswith("dlt"), ("untied 2U",)),
    "H4": (lambda label: any(label.endswith(f" + {part}") for part in ("rate", "residual", "injection", "adapters")), ("layout alone", "whole recipe")),
    "H5": (lambda label: " + onset" in label, ("layout alone", "whole recipe")),
    "H6": (lambda label: label == "dlt + recipe", None),
    "H7": (lambda label: not label.startswith("untied"), ("untied U",)),
}


def _hypothesis_lines(registration: dict, settings: BenchSettings, rows: dict, measure) -> list[str]:
    """Each hypothesis as registered, then the paired differences that bear on it on this task."""
    language = registration["tasks"][settings.loop_study]["metric"] == "test_loss"
    lines = ["", "The hypotheses as registered, each with the contrasts of this task that bear on it:", ""]
    for key, words in registration["hypotheses"].items():
        number = key.split()[0]
        if (number == "H7") != language:  # H7 is language's; the others are the depth tasks'
            continue
        keep, names = HYPOTHESIS_CONTRASTS[number]
        lines.append(f"- **{key}**: {words}")
        for label, row in rows.items():
            scored = measure(row)
            if not keep(label) or not scored:
                continue
            for name, difference in scored["versus"].items():
                if difference is not None and (names is None or name in names):
                    lines.append(f"  - {label} vs {_contrast_words(name, settings)}: {verdict_cell(difference, _margin_note(difference))}")
    return lines


def _contrast_words(name: str, settings: BenchSettings) -> str:
    budget = settings.max_distinct_blocks
    return {
        "untied U": f"{budget} untied blocks",
        "untied 2U": f"{2 * budget} untied blocks",
        "layout alone": "the same layout alone",
        "whole recipe": "the same layout under the whole recipe",
    }.get(name, name)


def _margin_note(difference: dict) -> str:
    if "equivalent_within_margin" not in difference or difference["verdict"] != "no difference detected":
        return ""
    return f"; {'shown' if difference['equivalent_within_margin'] else 'not shown'} to be within ±{EQUIVALENCE_MARGIN} nats"

