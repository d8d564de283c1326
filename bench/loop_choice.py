#!/usr/bin/env python
"""Issue 76, item 1: which word problems test depth at the study's width, chosen on seeds 0-4 before they are
registered for the loop study's fresh seeds.

Each candidate (a group and a length) trains 2 and 4 untied blocks under the depth tasks' training (preset `depth`
with the recipe frozen for depth-fresh: linear decay, weight decay 0.1), seeds 0-4, into a results folder of its own:

    python bench/run_bench.py --preset depth --task word_problem:group=A4,length=16 --block_size 18 \
        --lr_scheduler_type linear --rows "none|untied, 2 blocks" --seeds 0,1,2,3,4 \
        --results_dir bench/results/loops-choice/A4-16 --jobs 2

and `python bench/loop_choice.py` writes bench/reports/study/loops/choice.{md,json} from every such folder, by the
rule `RULE` fixed before the first of these runs finished (`CLEAR_DIFFERENCE`: a clear win, not a marginal one). The
test split is reported beside, never chosen on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from bench.markdown_tables import estimate, refresh_after_report  # noqa: E402
from bench.provenance import source_lines  # noqa: E402
from bench.report import interval, load_result, paired_difference, verdict_cell  # noqa: E402
from bench.scheduling import write_whole  # noqa: E402
from bench.settings import PRESETS, folder_settings  # noqa: E402
from hf_layertie.data import WordProblemConfig, is_solvable  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "loops-choice"
REPORT = REPO_ROOT / "bench" / "reports" / "study" / "loops"
CHOICE_SEEDS = (0, 1, 2, 3, 4)
ROWS = {"budget": ("untied, 2 blocks", "L2/none"), "ceiling": ("untied, 4 blocks", "none")}  # label, run folder
CLEAR_DIFFERENCE = 0.05  # mean accuracy: 5 points, the least difference called a clear win
RULE = (
    "the paired difference of the mean validation accuracy, 4 untied blocks minus 2, over seeds 0-4 with its 95% "
    f"interval; a candidate tests depth when that interval excludes 0 and its mean is at least {CLEAR_DIFFERENCE:g}. Per "
    "kind (solvable, non-solvable), the candidate of highest lower bound among those is chosen; a kind with none is "
    "left out of the study."
)


# What every candidate trains under: depth's model and steps, the recipe frozen for depth-fresh (linear decay; weight
# decay 0.1, the study's, which a fingerprint leaves out).
TRAINING = {name: getattr(PRESETS["depth"], name) for name in ("n_layer", "n_embd", "n_head", "max_steps", "batch_size", "learning_rate")}
TRAINING["lr_scheduler_type"] = "linear"


def candidate(folder: Path) -> dict:
    """One candidate's runs, its group's kind and the paired differences (validation, and test beside); a folder
    trained otherwise than the candidates are is refused, naming the setting."""
    settings = folder_settings(folder)
    for name, value in TRAINING.items():
        if settings.get(name) != value or "weight_decay" in settings:
            raise ValueError(f"{folder}: trained with {name}={settings.get(name)!r} (weight decay {settings.get('weight_decay', 0.1)}), not as the candidates are ({TRAINING})")
    task = settings["task"]
    config = WordProblemConfig.from_string(task.partition(":")[2])
    runs = {
        row: {seed: load_result(path) for seed in CHOICE_SEEDS if ((path := folder / "study" / run / f"seed{seed}") / "result.json").is_file()}
        for row, (_, run) in ROWS.items()
    }
    validation = paired_difference(runs["ceiling"], runs["budget"], key="validation_mean_accuracy")
    test = paired_difference(runs["ceiling"], runs["budget"], key="mean_accuracy")
    return {
        "task": task,
        "group": config.group,
        "length": config.length,
        "kind": "solvable" if is_solvable(config.group) else "non-solvable",
        "seeds": sorted(runs["budget"].keys() & runs["ceiling"].keys()),
        "accuracy": {row: interval([run["mean_accuracy"] for run in by_seed.values()]) if by_seed else None for row, by_seed in runs.items()},
        "validation_difference": validation,
        "test_difference": test,
        "tests_depth": _tests_depth(validation),
        "records": [run for by_seed in runs.values() for run in by_seed.values()],
    }


def _tests_depth(difference: dict | None) -> bool:
    """The rule: every choice seed paired, the interval above 0, the mean at least CLEAR_DIFFERENCE."""
    return (
        difference is not None and difference["seeds"] == len(CHOICE_SEEDS) and difference["verdict"] == "higher"
        and difference["mean"] >= CLEAR_DIFFERENCE
    )  # fmt: skip


def choose(candidates: list[dict]) -> dict[str, str | None]:
    """Per kind, the task of the candidate that tests depth with the highest lower bound, or None."""
    chosen = {}
    for kind in ("solvable", "non-solvable"):
        passing = [c for c in candidates if c["kind"] == kind and c["tests_depth"]]
        lower = lambda c: c["validation_difference"]["mean"] - c["validation_difference"]["half_width"]  # noqa: E731
        chosen[kind] = max(passing, key=lower)["task"] if passing else None
    return chosen


def write_report(report_dir: Path = REPORT) -> Path:
    folders = sorted(RESULTS.iterdir()) if RESULTS.is_dir() else []
    candidates = [candidate(folder) for folder in folders if (folder / "settings.json").is_file()]
    chosen = choose(candidates)
    records = [record for c in candidates for record in c.pop("records")]
    payload = {"rule": RULE, "candidates": candidates, "chosen": chosen}
    report_dir.mkdir(parents=True, exist_ok=True)
    write_whole(report_dir / "choice.json", json.dumps(payload, indent=2))
    lines = [
        "Which word problems test depth at width 64 (issue 76, item 1): 2 against 4 untied blocks under the depth tasks' "
        "training, seeds 0-4 (`python bench/loop_choice.py`). The rule: " + payload["rule"],
        "",
        "| task | kind | seeds | 2 untied blocks, test accuracy | 4 untied blocks, test accuracy | 4 minus 2, validation | 4 minus 2, test | tests depth |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in candidates:
        budget, ceiling = (estimate(*c["accuracy"][row]) if c["accuracy"][row] else "" for row in ("budget", "ceiling"))
        lines.append(
            f"| `{c['task']}` | {c['kind']} | {len(c['seeds'])} | {budget} | {ceiling} | {verdict_cell(c['validation_difference'])} "
            f"| {verdict_cell(c['test_difference'])} | {'yes' if c['tests_depth'] else 'no'} |"
        )
    lines += ["", "Chosen: " + "; ".join(f"{kind}: {f'`{task}`' if task else 'none (no candidate tests depth here)'}" for kind, task in chosen.items()) + "."]
    lines += source_lines(records)
    report = report_dir / "choice.md"
    write_whole(report, "\n".join(lines) + "\n")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report_dir", default=str(REPORT), help="Where choice.md and choice.json go.")
    report = write_report(Path(parser.parse_args().report_dir))
    print(f"Report: {report}")
    refresh_after_report(report)


if __name__ == "__main__":
    main()
