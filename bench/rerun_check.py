#!/usr/bin/env python
"""A study's rows trained again (on another machine, or at another commit) and paired seed by seed with the study's
own records: do reruns repeat them? On the same machine a run is deterministic, so each seed should repeat its
metric to the last digit; on another processor the float kernels round differently and training takes another
path from the same initialisation and data order, so each seed moves, and the question is whether the processor
shifts the row (a paired interval that excludes 0) or only adds noise. The loop study's language records came from
two processor types (bench/README.md, "The loop recipe", says which rows), so its contrasts across them rest on this;
the k-hop study's first records name a worktree with an uncommitted report in it (`+dirty`), so whether they repeat
from the clean commit says whether that mattered.

    python bench/run_bench.py --preset loops-language --rows "0 1 2 1 2 5 + recipe" \\
        --results_dir bench/results/loops-language-hardware --jobs 2
    python bench/rerun_check.py --preset loops-language --rows "0 1 2 1 2 5 + recipe" \\
        --rerun bench/results/loops-language-hardware       # bench/reports/study/loops-language/rerun.{md,json}

Both folders must hold runs measured under the preset's settings (another is refused, naming it), and share a seed
of each row. Seeds are compared on the study's metric (its pre-registered one for a loop study, the test loss
otherwise). The report is written from the records alone: a seed is on the same hardware when both records name
the same processor and threads (two hosts of one processor model count as the same).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from bench.loop_study import read_preregistration  # noqa: E402
from bench.markdown_tables import refresh_after_report  # noqa: E402
from bench.provenance import source_lines  # noqa: E402
from bench.report import EQUIVALENCE_MARGIN, paired_difference, preset_study, shown_path  # noqa: E402
from bench.scheduling import write_whole  # noqa: E402
from bench.settings import PRESETS, row_labels  # noqa: E402
from bench.templates import render  # noqa: E402


@dataclass
class RerunCheckArguments:
    """Flags of `bench/rerun_check.py`."""

    preset: str = field(metadata={"help": "The study's preset: its records are in bench/results/<preset>."})
    rows: str = field(metadata={"help": "The rows' labels, as the study's report names them, separated by '|' (as run_bench.py --rows)."})
    rerun: str = field(metadata={"help": "The folder the rows were trained again into (run_bench.py --results_dir)."})
    report_dir: str | None = field(default=None, metadata={"help": "Where rerun.md and .json go. Default: bench/reports/study/<preset>."})


def folder_rows(preset: str, folder: Path, flag: str) -> dict[str, dict[int, dict]]:
    """label -> seed -> finished record of preset `preset`'s runs in `folder` (`preset_study`), the folder `flag`
    gave; a folder where no run was measured is refused, naming the flag."""
    table = preset_study(preset, folder)
    if not table:
        raise FileNotFoundError(f"{flag}: {folder} has no settings.json, so no run of preset {preset!r} was measured there")
    return table


def row_records(table: dict[str, dict[int, dict]], label: str, preset: str) -> dict[int, dict]:
    """seed -> record of row `label` in the study's `folder_rows` table; a row it has not is refused, naming --rows."""
    if label not in table:
        raise ValueError(f"--rows {label!r}: preset {preset!r}'s study has no such row (its rows: {' | '.join(table)})")
    return table[label]


def study_metric(preset: str) -> str:
    """The record field a preset's study compares rows on: a loop study's pre-registered metric, else the test loss."""
    task = PRESETS[preset].loop_study
    return read_preregistration()["tasks"][task]["metric"] if task else "test_loss"


def compare(study: dict[int, dict], rerun: dict[int, dict], metric: str) -> dict:
    """Each seed both have, with both records' metric, hardware and commit, and whether the rerun repeated the
    study's value exactly; and the paired difference (rerun minus study) over the seeds whose hardware differs."""
    seeds = sorted(study.keys() & rerun.keys())
    pairs = [
        {
            "seed": seed,
            "same_hardware": study[seed]["hardware"] == rerun[seed]["hardware"],
            "repeated": study[seed][metric] == rerun[seed][metric],
            **{side: {metric: records[seed][metric], "hardware": records[seed]["hardware"], "commit": records[seed].get("commit")} for side, records in (("study", study), ("rerun", rerun))},
        }
        for seed in seeds
    ]  # fmt: skip
    moved = {pair["seed"] for pair in pairs if not pair["same_hardware"]}
    return {
        "pairs": pairs,
        "other_hardware": paired_difference({seed: rerun[seed] for seed in moved}, {seed: study[seed] for seed in moved}, metric),
    }


def write_report(arguments: RerunCheckArguments) -> Path:
    """rerun.{json,md} from both folders' records of the rows."""
    study_folder, rerun_folder = REPO_ROOT / "bench" / "results" / arguments.preset, Path(arguments.rerun).resolve()
    if rerun_folder == study_folder.resolve():
        raise ValueError(f"--rerun {arguments.rerun}: the study's own folder; pass the folder the rows were trained again into")
    studied, trained_again = folder_rows(arguments.preset, study_folder, "--preset"), folder_rows(arguments.preset, rerun_folder, "--rerun")
    metric, rows, records = study_metric(arguments.preset), {}, []
    for label in row_labels(arguments.rows):
        study, rerun = row_records(studied, label, arguments.preset), trained_again.get(label, {})
        paired = study.keys() & rerun.keys()
        if not paired:
            raise ValueError(f"--rerun {arguments.rerun}: no finished seed of {label!r} that the study has too (study: {sorted(study)}, rerun: {sorted(rerun)})")
        rows[label] = compare(study, rerun, metric)
        records += [sides[seed] for seed in sorted(paired) for sides in (study, rerun)]
    payload = {"preset": arguments.preset, "rows": rows, "rerun": shown_path(rerun_folder), "metric": metric}
    report_dir = Path(arguments.report_dir) if arguments.report_dir else REPO_ROOT / "bench" / "reports" / "study" / arguments.preset
    report_dir.mkdir(parents=True, exist_ok=True)
    write_whole(report_dir / "rerun.json", json.dumps(payload, indent=2))
    report = report_dir / "rerun.md"
    sources = "\n".join(source_lines(records)[1:])
    write_whole(report, render("rerun_check.md.jinja", **payload, margin=EQUIVALENCE_MARGIN, sources=sources))
    return report


def main() -> None:
    (arguments,) = HfArgumentParser(RerunCheckArguments).parse_args_into_dataclasses()
    report = write_report(arguments)
    print(f"Report: {report}")
    refresh_after_report(report)


if __name__ == "__main__":
    main()
