"""The report of one task of the pre-registered loop study (presets `loops-*`, bench/loop_study.py): every row's
score with its paired differences from U and 2U untied blocks, from the same layout alone and from the same layout
under the whole recipe, then the contrasts that decide each hypothesis, listed under it as the pre-registration
words it. Verdicts are the intervals'; the report judges nothing the file did not fix in advance."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable

from .loop_study import read_preregistration
from .report import EQUIVALENCE_MARGIN, _distinct_runs, _page_context
from .settings import PRESETS, RECIPE_FIELDS, BenchSettings, preregistered
from .templates import render

# Contrast name (bench/loop_study.py's `versus`, and `untied U` from the report's baselines) -> column header.
LOOP_STUDY_CONTRASTS = {
    "untied U": "vs untied U",
    "untied 2U": "vs untied 2U",
    "layout alone": "vs the layout alone",
    "whole recipe": "vs the layout under the recipe",
}


def loop_study_markdown(settings: BenchSettings, payload: dict) -> str:
    """The page of one task of the loop study (bench/templates/loop_study.md.jinja) from a report's payload."""
    registration = read_preregistration()
    plan = registration["tasks"][settings.loop_study]
    if registration["margin_nats"] != EQUIVALENCE_MARGIN:
        raise ValueError(f"the pre-registered margin {registration['margin_nats']} is not the reports' {EQUIVALENCE_MARGIN}")
    records = _distinct_runs(payload["runs"])
    on_accuracy = plan["metric"] == "mean_accuracy"

    def measure(row: dict) -> dict:
        """The pre-registered metric's summary and paired differences for a row."""
        if on_accuracy:
            return {"value": row["accuracy"]["mean_accuracy"], "versus": row["accuracy"]["versus"]} if row["accuracy"] else {}
        return {"value": (row["test_loss"], row["test_loss_half_width"]), "versus": row["versus"]}

    scored = {label: score for label, row in payload["rows"].items() if (score := measure(row))}
    completion = _completion(payload["runs"], registration["seeds"])
    return render(
        "loop_study.md.jinja",
        **_page_context(settings, payload, records),
        on_accuracy=on_accuracy,
        # The commit each record found the pre-registration committed in when it started.
        commits=sorted({record.get("preregistration_commit", "none recorded") for record in records}),
        contrasts=LOOP_STUDY_CONTRASTS,
        scored=scored,
        parameters=_trainable_parameters(payload["runs"]),
        hypotheses=_hypotheses(registration, settings, payload, scored, completion),
        margin=EQUIVALENCE_MARGIN,
        completion=completion,
        registration_preset=plan["preset"],
        departures=departures(settings, plan["preset"]),
    )


def departures(settings: BenchSettings, registered_preset: str) -> dict[str, tuple]:
    """setting -> (these runs' value, the registered preset's) where what they measure differs (`fingerprint`, which
    leaves scheduling out): a folder trained otherwise (preset loops-language-gpu's width) is not the registered study,
    and its page says so before its verdicts, which read the registered sentences on other runs. A frozen recipe's
    fields are no departure either: the preset takes them from its folder's claim (`freeze_recipe`), not its file."""
    registered = preregistered(PRESETS[registered_preset])
    measured, expected = json.loads(settings.fingerprint()), json.loads(registered.fingerprint())
    same_anyway = RECIPE_FIELDS if registered.frozen_recipe else ()
    return {
        name: (measured.get(name), expected.get(name))
        for name in dict.fromkeys([*measured, *expected])  # in the settings' order, for a page that rebuilds alike
        if name not in same_anyway and measured.get(name) != expected.get(name)
    }


def _trainable_parameters(runs: dict[str, dict[str, dict]]) -> dict[str, float]:
    """label -> the trainable parameters its runs ended with, mean over seeds: "equal parameters" is the issue's
    condition, and the recipe's per-position adapters add theirs to the U blocks' (a fixed map ends with the same
    count on every seed; DLT's depends on the map it ends with)."""
    return {label: statistics.fmean(run["trainable_parameters"] for run in by_seed.values()) for label, by_seed in runs.items() if by_seed}


def _completion(runs: dict[str, dict[int, dict]], seeds: list[int]) -> dict:
    """How far the task's plan has run: `complete` once every row has every registered seed (every verdict is
    final then; before, only those `_settled_by` or `_bearing_rows_finished` finds), with the rows not yet started and the fewest seeds a started row has."""
    started = [set(by_seed) & set(seeds) for by_seed in runs.values() if by_seed]
    return {
        "complete": all(set(seeds) <= set(by_seed) for by_seed in runs.values()),
        "registered_seeds": len(seeds),
        "rows": len(runs),
        "rows_not_started": len(runs) - len(started),
        "fewest_seeds": min(map(len, started), default=0),
    }


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


def _hypotheses(registration: dict, settings: BenchSettings, payload: dict, scored: dict[str, dict], completion: dict) -> list[dict]:
    """Each hypothesis this task tests, as registered (`key`, `words`), with the paired differences that bear on it
    on this task: (label, contrast name, difference) under `contrasts`, and for H6 under `learned_map` (the better
    fixed layout, the difference), or None; and its `outcome` (`decide`), `final` once no run yet to come can change
    it (`_settled_by`, the rows that make it so, or `_bearing_rows_finished`)."""
    language = registration["tasks"][settings.loop_study]["metric"] == "test_loss"
    hypotheses = []
    for key, words in registration["hypotheses"].items():
        number = key.split()[0]
        if number in (DEPTH_ONLY if language else LANGUAGE_ONLY):
            continue
        contrasts = [] if number == "H6" else [
            (label, name, difference) for label, score in scored.items() for name in HYPOTHESIS_CONTRASTS[number](label)
            if (difference := score["versus"].get(name)) is not None
        ]  # fmt: skip
        learned_map = _learned_map(payload, scored, language) if number == "H6" else None
        deciding = contrasts + ([("dlt + recipe", *learned_map)] if learned_map else [])
        outcome = decide(number, deciding, better="lower" if language else "higher")
        outcome["settled_by"] = _settled_by(outcome, deciding, completion["registered_seeds"])
        outcome["final"] = (
            completion["complete"]
            or bool(outcome["settled_by"])
            or _bearing_rows_finished(number, payload["runs"], contrasts, completion["registered_seeds"])
        )
        hypotheses.append({"key": key, "words": words, "contrasts": contrasts, "learned_map": learned_map, "outcome": outcome})
    return hypotheses


def _settled_by(outcome: dict, contrasts: list[tuple[str, str, dict]], registered_seeds: int) -> list[str]:
    """The rows that make an outcome final before every row has run: of the rows it names, when each of them decides
    it alone (`by_rows_named`: a row that refutes a "no row" or "every row" sentence, or that proves H3's "some
    layout"), those whose contrasts are paired on every registered seed. Rows yet to run, and more seeds of the
    other rows named, only add contrasts, and one such row decides whatever they show."""
    if not outcome["by_rows_named"]:
        return []
    short = {label for label, _, difference in contrasts if difference["seeds"] < registered_seeds}
    return [label for label in outcome["by"] if label not in short]


def _bearing_rows_finished(number: str, planned: Iterable[str], contrasts: list[tuple[str, str, dict]], registered_seeds: int) -> bool:
    """Whether every planned row that bears on hypothesis `number` has each of its contrasts paired on every
    registered seed: then the rows yet to run bear on it not at all, and its verdict, holding or not, is final (H4's
    parts, once their tier has run, whatever the onset and DLT rows show). Never for H6, whose contrast is chosen on
    validation among rows (`_learned_map`), nor for a hypothesis no planned row bears on."""
    if number == "H6":
        return False
    bearing = {(label, name) for label in planned for name in HYPOTHESIS_CONTRASTS[number](label)}
    paired = {(label, name) for label, name, difference in contrasts if difference["seeds"] >= registered_seeds}
    return bool(bearing) and bearing <= paired


def decide(number: str, contrasts: list[tuple[str, str, dict]], better: str) -> dict:
    """Hypothesis `number`'s outcome from the contrasts that bear on it ((label, contrast name, paired difference)),
    each sentence of the pre-registration read as it stands, with its metric's rule: a row is above or below another
    when the interval of their difference excludes 0, `better` being the verdict of a better score ("lower" loss,
    "higher" accuracy). `holds`: True, False, or None while no contrast has run; `by`: the labels that decide it;
    `by_rows_named`: whether those rows alone decide it (a row that refutes a "no row" or "every row" sentence, or
    the row that H3's "some layout" finds), so that rows yet to run cannot change it."""
    outcome = _decided(number, contrasts, better)
    return outcome | {"by_rows_named": outcome["holds"] is (number == "H3")}


def _decided(number: str, contrasts: list[tuple[str, str, dict]], better: str) -> dict:
    """`decide`'s `holds` and `by`, by each sentence's reading."""
    if not contrasts:
        return {"holds": None, "by": []}
    worse = "higher" if better == "lower" else "lower"
    by_label: dict[str, dict[str, str]] = {}
    for label, name, difference in contrasts:
        by_label.setdefault(label, {})[name] = difference["verdict"]
    if number in ("H1", "H2"):  # the row is above the other
        failing = [label for label, verdicts in by_label.items() if better not in verdicts.values()]
        return {"holds": not failing, "by": failing or list(by_label)}
    if number == "H3":  # some layout under the whole recipe is not below 2U untied blocks
        reaching = [label for label, verdicts in by_label.items() if verdicts["untied 2U"] != worse]
        return {"holds": bool(reaching), "by": reaching or list(by_label)}
    if number == "H4":  # no part above its layout alone while not below the whole recipe
        alone = [label for label, verdicts in by_label.items() if verdicts.get("layout alone") == better and verdicts.get("whole recipe") not in (worse, None)]
        return {"holds": not alone, "by": alone}
    if number == "H5":  # the onset changes nothing detectably
        changed = [label for label, verdicts in by_label.items() if set(verdicts.values()) != {"no difference detected"}]
        return {"holds": not changed, "by": changed}
    # H6 (DLT not above the better fixed layout) and H7 (no looped layout below 4 untied blocks): no row better.
    above = [label for label, verdicts in by_label.items() if better in verdicts.values()]
    return {"holds": not above, "by": above}


def _learned_map(payload: dict, scored: dict[str, dict], language: bool) -> tuple[str, dict] | None:
    """H6: DLT under the recipe (every part but the adapters, which a moving map cannot hold) against the fixed
    layout under the whole recipe of best mean validation score: that layout and the difference, or None."""
    better = _better_under_recipe(payload["runs"], language)
    difference = scored["dlt + recipe"]["versus"].get(better) if "dlt + recipe" in scored and better else None
    return None if difference is None else (better, difference)


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
