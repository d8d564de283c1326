"""Does depth matter on k-hop induction, and does a deep model tied to fewer blocks get it at a shallow one's memory?

    python bench/hop_depth.py --jobs 2         # 4 models x 5 seeds, about 65 minutes on 2 cores
    python bench/hop_depth.py --seeds 5,6      # more seeds later (finished runs are kept)
    python bench/hop_depth.py --report_only    # bench/reports/study/depth/hop_induction.{md,json,png} from finished runs

The task is `hf_layertie.data.hop_induction` (Sanford et al.'s k-hop induction, a label at every position), chosen
because its depth need is known: a model of depth L is shown to reach about 2^(L-2) hops. Every run is one
`bench/hop_probe.py` process (one thread, GPT-2 of width 64, 5,000 AdamW steps of 32 examples at 1e-3 with
warm-up and linear decay, batches in the seed's order), so the models of a seed see the same batches; its record
is `bench/results/hop-depth/<row>/seed<S>/result.json`. The rows: untied 2 blocks (the memory budget), untied 4
blocks (the ceiling), and 4 blocks tied to 2 distinct, looped (`cycle:2`, as looped transformers reuse blocks) and
in runs (`sequence:2`): the tied models train exactly the untied 2-block model's parameters.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.markdown_tables import MIB, estimate, refresh_after_report  # noqa: E402
from bench.provenance import source_lines  # noqa: E402
from bench.report import accuracy_summary, paired_difference, verdict_cell  # noqa: E402
from bench.scheduling import RESULT_FILE, Job, run_jobs, write_complete  # noqa: E402
from bench.settings import REPO_ROOT, parse_integers  # noqa: E402
from hf_layertie import resolve_tying_map  # noqa: E402

TASK = "length=64,max_hops=4"
STEPS = 5000
RESULTS = REPO_ROOT / "bench" / "results" / "hop-depth"
REPORT = REPO_ROOT / "bench" / "reports" / "study" / "depth"


@dataclass(frozen=True)
class Row:
    label: str
    n_layer: int
    tying_map: str

    @property
    def directory(self) -> str:
        return "".join(character if character.isalnum() else "-" for character in self.label).strip("-")


ROWS = (
    Row("untied, 2 blocks", 2, "independent"),
    Row("untied, 4 blocks (ceiling)", 4, "independent"),
    Row("4 blocks tied to 2, cycle (looped)", 4, "cycle:2"),
    Row("4 blocks tied to 2, sequence", 4, "sequence:2"),
)
BUDGET = ROWS[0]  # the equal-memory baseline every row is paired with


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2,3,4", help="Comma-separated seeds.")
    parser.add_argument("--jobs", type=int, default=1, help="Runs at once (each uses one thread).")
    parser.add_argument("--results_dir", type=Path, default=RESULTS, help="Where each run's result.json goes.")
    parser.add_argument("--report_dir", type=Path, default=REPORT, help="Where hop_induction.{md,json,png} go.")
    parser.add_argument("--report_only", action="store_true", help="Write the report from finished runs; train nothing.")
    args = parser.parse_args()
    try:
        seeds = parse_integers(args.seeds, "seeds")
    except ValueError as error:
        parser.error(str(error))
    failures = [] if args.report_only else _run_all(seeds, args.jobs, args.results_dir)
    print(f"Report: {write_report(seeds, args.results_dir, args.report_dir)}")
    refresh_after_report(args.report_dir)
    if failures:
        sys.exit(f"{len(failures)} run(s) failed, see their log.txt:\n" + "\n".join(failures))


def _run_all(seeds: tuple[int, ...], jobs: int, results_dir: Path) -> list[str]:
    for row in ROWS:
        _finished(results_dir, row, seeds)  # finished runs measured under other settings stop it here
    todo = [(row, seed) for seed in seeds for row in ROWS if not (_run_dir(results_dir, row, seed) / RESULT_FILE).is_file()]
    jobs_left = [_job(row, seed, results_dir) for row, seed in todo]
    failures: list[str] = []
    with tqdm(total=len(todo), desc="hop-depth runs", unit="run") as progress:
        run_jobs(lambda: jobs_left.pop(0) if jobs_left else None, lambda job, code: _record(job, code, failures, progress), jobs)
    return failures


def _run_dir(results_dir: Path, row: Row, seed: int) -> Path:
    return results_dir / row.directory / f"seed{seed}"


def _job(row: Row, seed: int, results_dir: Path) -> Job:
    """One probe process, writing its measurements to `probe.json` in its run folder."""
    run_dir = _run_dir(results_dir, row, seed)
    command = [
        sys.executable, str(REPO_ROOT / "bench" / "hop_probe.py"), "--task_name", "hop_induction", "--task", TASK,
        "--n_layer", str(row.n_layer), "--tying_map", row.tying_map, "--steps", str(STEPS), "--seed", str(seed),
        "--result_file", str(run_dir / "probe.json"),
    ]  # fmt: skip
    return Job(f"{row.label} seed {seed}", run_dir, command, payload=(row, seed))


def _record(job: Job, returncode: int, failures: list[str], progress) -> None:
    """A finished probe's result file: its measurements, the row's label and where it came from."""
    progress.update()
    if returncode != 0:
        failures.append(job.failure(returncode))
        return
    (row, seed), partial = job.payload, job.run_dir / "probe.json"
    probe = json.loads(partial.read_text())
    # The study's run fields: a fixed map's peak of distinct blocks is its count. The probe took its provenance
    # when it started.
    record = {"label": row.label, **probe, "num_blocks": row.n_layer, "distinct_peak": probe["distinct_blocks"]}
    write_complete(job.run_dir / RESULT_FILE, record)
    partial.unlink()
    progress.write(f"{row.label} seed {seed}: mean accuracy {record['mean_accuracy']:.3f}")


def write_report(seeds: tuple[int, ...], results_dir: Path = RESULTS, report_dir: Path = REPORT) -> Path:
    table = {row.label: _finished(results_dir, row, seeds) for row in ROWS}
    hops = sorted({hop for runs in table.values() for run in runs.values() for hop in run["accuracy_by_hops"]}, key=int)
    summary = {label: _summarise(runs, table[BUDGET.label], hops) for label, runs in table.items() if runs}
    measured = {label: runs for label, runs in table.items() if runs}
    # Every pair of rows, row minus column: the tied rows against the ceiling and against each other, too.
    pairs = {first: {second: paired_difference(measured[first], measured[second], key="mean_accuracy") for second in measured if second != first} for first in measured}
    report_dir.mkdir(parents=True, exist_ok=True)
    records = [run for runs in table.values() for run in runs.values()]
    payload = {"task": TASK, "steps": STEPS, "rows": summary, "pairs": pairs, "records": records}
    (report_dir / "hop_induction.json").write_text(json.dumps(payload, indent=2))
    _plot(summary, hops, report_dir / "hop_induction.png")
    (report_dir / "hop_induction.md").write_text(_markdown(summary, hops, pairs, records))
    return report_dir / "hop_induction.md"


def _finished(results_dir: Path, row: Row, seeds: tuple[int, ...]) -> dict[int, dict]:
    runs = {}
    for seed in seeds:
        path = _run_dir(results_dir, row, seed) / RESULT_FILE
        if path.is_file():
            run = json.loads(path.read_text())
            measured = (run["task"], run["steps"], run["n_layer"], run["tying_map"])
            expected = (TASK, STEPS, row.n_layer, resolve_tying_map(row.tying_map, row.n_layer).to_list())
            if measured != expected:
                raise SystemExit(
                    f"{path} was measured with task, steps, blocks, map {measured}, not {expected}: delete it or pass "
                    "another --results_dir"
                )
            # Flat keys per hop count, for the paired differences.
            runs[seed] = {**run, **{f"accuracy_hops_{hop}": value for hop, value in run["accuracy_by_hops"].items()}}
    return runs


def _summarise(runs: dict[int, dict], budget: dict[int, dict], hops: list[str]) -> dict:
    accuracy = accuracy_summary(runs)
    return {
        "seeds": sorted(runs),
        "distinct_blocks": next(iter(runs.values()))["distinct_blocks"],
        "trainable_parameters": next(iter(runs.values()))["trainable_parameters"],
        "train_seconds": statistics.fmean(run["train_seconds"] for run in runs.values()),
        "peak_state_bytes": max(run["peak_state_bytes"] for run in runs.values()),
        "mean_accuracy": accuracy["mean_accuracy"],
        "accuracy_by_hops": accuracy["by_hops"],
        "versus_budget": None if runs is budget or not budget else {
            "mean_accuracy": paired_difference(runs, budget, key="mean_accuracy"),
            **{f"hops_{hop}": paired_difference(runs, budget, key=f"accuracy_hops_{hop}") for hop in hops},
        },
    }  # fmt: skip


def _markdown(summary: dict, hops: list[str], pairs: dict, records: list[dict]) -> str:
    lines = [
        "# Depth on k-hop induction: untied and tied models at a 2-block memory budget",
        "",
        f"`python bench/hop_depth.py` (task `{TASK}`, {STEPS} steps; bench/hop_depth.py says how each run is made). "
        "Accuracy per hop count over every position of the 500 examples of the validation split (the split seed 0's "
        "first look kept the setting on; positions whose hops find no earlier letter count, with the answer `~`), "
        "mean ± 95% t-interval over seeds; differences paired by seed against "
        f"**{BUDGET.label}**, the model with the same trainable parameters (so the same training state: parameters, "
        "gradients and AdamW moments) as the tied rows.",
        "",
        "| row | seeds | distinct blocks | parameters | " + " | ".join(f"{hop} hops" for hop in hops) + " | mean | vs budget (mean) | peak state MiB | train s |",
        "|---|---|---|---|" + "---|" * len(hops) + "---|---|---|---|",
    ]
    for label, row in summary.items():
        cells = [estimate(*row["accuracy_by_hops"][hop]) for hop in hops]
        versus = row["versus_budget"]
        difference = versus["mean_accuracy"] if versus else None
        cell = verdict_cell(difference)
        lines.append(
            f"| {label} | {len(row['seeds'])} | {row['distinct_blocks']} | {row['trainable_parameters']:,} | "
            + " | ".join(cells) + f" | {estimate(*row['mean_accuracy'])} | {cell} | {row['peak_state_bytes'] / MIB:.2f} | {row['train_seconds']:.0f} |"
        )
    lines += ["", "Paired differences against the budget, per hop count (accuracy points):", ""]
    for label, row in summary.items():
        if row["versus_budget"]:
            differences = [row["versus_budget"][f"hops_{hop}"] for hop in hops]
            parts = [f"{hop} hops {estimate(d['mean'], d['half_width'], signed=True)}" for hop, d in zip(hops, differences)]
            lines.append(f"- {label}: " + ", ".join(parts))
    labels = list(pairs)
    lines += ["", "Every pair, mean accuracy over hop counts, row minus column (paired by seed):", ""]
    lines += ["| row | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for first in labels:
        cells = [verdict_cell(pairs[first].get(second)) for second in labels]
        lines.append(f"| {first} | " + " | ".join(cells) + " |")
    lines += ["", "![accuracy per hop count](hop_induction.png)"] + source_lines(records) + [""]
    return "\n".join(lines)


def _plot(summary: dict, hops: list[str], path: Path) -> None:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4))
    axes = figure.subplots()
    for label, row in summary.items():
        means = [row["accuracy_by_hops"][hop][0] for hop in hops]
        halves = [row["accuracy_by_hops"][hop][1] for hop in hops]
        axes.errorbar([int(hop) for hop in hops], means, yerr=halves, marker="o", capsize=3, label=label)
    axes.set_xlabel("hops")
    axes.set_ylabel("accuracy (validation)")
    axes.set_xticks([int(hop) for hop in hops])
    axes.set_title("k-hop induction, width 64, 5,000 steps")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
