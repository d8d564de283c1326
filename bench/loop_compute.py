#!/usr/bin/env python
"""Issue 76: the loop study's recommended language loop against 4 untied blocks given its compute, by the addendum
registered in bench/preregistration/looped-language-compute.json before the rival's first run.

    python bench/run_bench.py --preset loops-language-steps --rows "untied, 4 blocks" --jobs 2   # the rival, 10 runs
    python bench/loop_compute.py     # bench/reports/study/loops/compute-language.{md,json}, from the committed records

The loop's records are its preset's (`loops-language`, the study's), the rival's are `loops-language-steps`' (the
same training at 3,000 steps); each folder must hold runs measured under its preset's settings (another is refused,
naming it), and the pairs are the registered seeds both rows have. The verdict is the registered rule's: the loop
below or above the rival when the 95% interval of the paired difference (loop minus rival) excludes 0, interim until
both rows have every registered seed. Each of the rival's records names the commit that held the addendum, committed
and unedited, when it started (no run of its preset starts otherwise); the loop's records predate the addendum, which
says so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from bench.markdown_tables import refresh_after_report  # noqa: E402
from bench.provenance import source_lines  # noqa: E402
from bench.report import interval, paired_difference, preset_study  # noqa: E402
from bench.scheduling import write_whole  # noqa: E402
from bench.templates import render  # noqa: E402

ADDENDUM = REPO_ROOT / "bench" / "preregistration" / "looped-language-compute.json"
RESULTS = REPO_ROOT / "bench" / "results"
REPORT = REPO_ROOT / "bench" / "reports" / "study" / "loops"


def row_records(side: dict, results: Path = RESULTS) -> dict[int, dict]:
    """seed -> record of the addendum's `loop` or `rival` ({"preset", "label"}), from its preset's results folder."""
    return preset_study(side["preset"], results / side["preset"]).get(side["label"], {})


def registration(records: list[dict]) -> dict:
    """The commits the rival's records name as holding the addendum when they started (a run of the rival's preset
    starts only under it committed and unedited, so each precedes its record: loop_study.addendum_commit), and
    whether every record names one (None with no record yet). From the records alone: no git history needed."""
    named = [record.get("preregistration_commit") for record in records]
    return {"commits": sorted({commit for commit in named if commit}), "every_record_names_one": all(named) if named else None}


def summary(records: dict[int, dict]) -> dict | None:
    """A row's test loss (mean, 95% half-width), seeds, steps, block positions and trainable parameters."""
    if not records:
        return None
    runs = list(records.values())
    return {
        "test_loss": interval([run["test_loss"] for run in runs]),
        "seeds": sorted(records),
        "steps": statistics.fmean(run["trained_steps"] for run in runs),
        "positions": statistics.fmean(run["num_blocks"] for run in runs),
        "trainable_parameters": statistics.fmean(run["trainable_parameters"] for run in runs),
    }


def write_report(report_dir: Path = REPORT, results: Path = RESULTS) -> Path:
    """compute-language.{json,md} from the committed records of both rows."""
    addendum = json.loads(ADDENDUM.read_text())
    loop, rival = row_records(addendum["loop"], results), row_records(addendum["rival"], results)
    difference = paired_difference(loop, rival)
    loop_row = summary(loop)
    if loop_row is not None:  # it carries its difference from the rival (loop minus rival), as a study's rows do
        loop_row["versus_rival"] = difference
    complete = all(set(addendum["seeds"]) <= set(row) for row in (loop, rival))
    payload = {
        "rows": {"loop": loop_row, "rival": summary(rival)},
        "holds": None if difference is None else difference["verdict"] == "lower",
        "final": complete,
        "registration": registration(list(rival.values())),
    }
    report_dir.mkdir(parents=True, exist_ok=True)
    write_whole(report_dir / "compute-language.json", json.dumps(payload, indent=2))
    records = [*loop.values(), *rival.values()]
    report = report_dir / "compute-language.md"
    sources = "\n".join(source_lines(records)[1:])
    write_whole(report, render("loop_compute.md.jinja", addendum=addendum, margin=addendum["margin_nats"], difference=difference, **payload, sources=sources))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report_dir", default=str(REPORT), help="Where compute-language.md and .json go.")
    report = write_report(Path(parser.parse_args().report_dir))
    print(f"Report: {report}")
    refresh_after_report(report)


if __name__ == "__main__":
    main()
