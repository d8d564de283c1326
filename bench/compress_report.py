"""The report of `bench/compress.py`: one record per run, and per row its mean test loss with a 95% t-interval and
its paired difference (by seed) to the best way of training small at the same memory, chosen on validation loss."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from .compress import CompressSettings, Row
from .report import interval, paired_difference

MIB = 2**20


def collect(rows: list[Row], seeds: tuple[int, ...], output: Path) -> dict[str, dict[int, dict]]:
    """label -> seed -> result, for every finished run."""
    table = {}
    for row in rows:
        table[row.label] = {}
        for seed in seeds:
            path = output / f"seed{seed}" / row.directory / "result.json"
            if path.is_file():
                table[row.label][seed] = json.loads(path.read_text())
    return table


def summarise(rows: list[Row], table: dict[str, dict[int, dict]]) -> dict:
    small = [row.label for row in rows if row.start == "scratch" and table[row.label]]
    best_small = min(small, key=lambda label: statistics.fmean(run["validation_loss"] for run in table[label].values()), default=None)
    summary = {}
    for row in rows:
        runs = table[row.label]
        if not runs:
            continue
        loss, half = interval([run["test_loss"] for run in runs.values()])
        summary[row.label] = {
            "seeds": sorted(runs),
            "test_loss": loss,
            "test_loss_half_width": half,
            "distinct_blocks": max(run["distinct_peak"] for run in runs.values()),
            "peak_state_mib": statistics.fmean(run["peak_state_bytes"] for run in runs.values()) / MIB,
            "peak_process_mib": statistics.fmean(run["peak_process_bytes"] for run in runs.values()) / MIB,
            "train_seconds": statistics.fmean(run["train_seconds"] for run in runs.values()),
            "versus_best_small": paired_difference(runs, table[best_small]) if best_small and best_small != row.label else None,
        }
    return {"best_small": best_small, "rows": summary}


def write_report(settings: CompressSettings, rows: list[Row], output: Path, report_dir: Path) -> Path:
    table = collect(rows, settings.seeds, output)
    summary = summarise(rows, table)
    records = [run for label in table for run in table[label].values()]
    report_dir.mkdir(parents=True, exist_ok=True)
    payload = {"settings": json.loads(settings.fingerprint()), "seeds": list(settings.seeds), **summary, "records": records}
    (report_dir / "results.json").write_text(json.dumps(payload, indent=2))
    (report_dir / "results.md").write_text(_markdown(settings, summary, records))
    return report_dir / "results.md"


def _markdown(settings: CompressSettings, summary: dict, records: list[dict]) -> str:
    teacher = sorted({(run["seed"], run["teacher_test_loss"]) for run in records if run.get("teacher_test_loss") is not None})
    lines = [
        "# Compressing a trained model by tying: the measured comparison",
        "",
        f"`python bench/compress.py` (settings: {json.dumps(json.loads(settings.fingerprint()))}). GPT-2 of "
        f"{settings.n_layer} x {settings.n_embd} trained {settings.teacher_steps} steps (the teacher), then every row "
        f"{settings.uptrain_steps} uptraining steps of {settings.batch_size} x {settings.block_size} tokens at most "
        f"{settings.distinct_blocks} blocks owning weights. Test loss in nats per token on the study's four test "
        "plays; 95% t-intervals over seeds; differences paired by seed against the best row that trains "
        f"{settings.distinct_blocks} blocks from scratch (chosen on validation loss: **{summary['best_small']}**). "
        "Memory in MiB: training state (parameters, gradients, AdamW state) and the process peak (VmHWM).",
        "",
        "Teacher test loss by seed before uptraining: " + ", ".join(f"seed {seed}: {loss:.3f}" for seed, loss in teacher),
        "",
        "| row | seeds | test loss | vs best small | distinct blocks | state MiB | process MiB | train s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, row in summary["rows"].items():
        difference = row["versus_best_small"]
        cell = f"{difference['mean']:+.3f} ± {difference['half_width']:.3f} ({difference['verdict']})" if difference else ""
        lines.append(
            f"| {label} | {len(row['seeds'])} | {row['test_loss']:.3f} ± {row['test_loss_half_width']:.3f} | {cell} | "
            f"{row['distinct_blocks']} | {row['peak_state_mib']:.2f} | {row['peak_process_mib']:.0f} | {row['train_seconds']:.0f} |"
        )
    versions = sorted({(run.get("commit"), json.dumps(run.get("versions"))) for run in records})
    lines += ["", "Runs came from: " + "; ".join(f"commit {commit}, {v}" for commit, v in versions), ""]
    return "\n".join(lines)
