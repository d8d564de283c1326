"""The bench's outputs: ratios against conventional training, results.md, results.json and two plots."""

from __future__ import annotations

import json
import math
import os
import platform
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt  # noqa: E402

BASELINE = "none"
# Measurements compared with the conventional run, as value / value of `none`.
RATIO_KEYS = (
    "distinct_blocks",
    "trainable_parameters",
    "block_parameters",
    "shakespeare_perplexity",
    "wikitext_perplexity",
    "state_bytes_total",
    "analytic_floor_bytes",
    "peak_memory_bytes",
    "tokens_per_second",
    "checkpoint_bytes",
)
MIB = 2**20


def _value(run: dict, key: str):
    return run["state_bytes"]["total"] if key == "state_bytes_total" else run[key]


def add_ratios(runs: list[dict]) -> None:
    """Give every run `ratios_vs_none`: each of `RATIO_KEYS` divided by the same measurement of `none`."""
    baseline = next((run for run in runs if run["strategy"] == BASELINE), None)
    if baseline is None:
        raise ValueError(f"no {BASELINE!r} run to compare with among {[run['strategy'] for run in runs]}")
    for run in runs:
        run["ratios_vs_none"] = {key: _ratio(_value(run, key), _value(baseline, key)) for key in RATIO_KEYS}


def _ratio(value, reference) -> float | None:
    if value is None or reference is None or reference == 0:
        return None
    return value / reference


def hardware() -> dict:
    """What the numbers were measured on."""
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [
            line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")
        ]
        cpu = names[0] if names else cpu
    return {
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
    }


def write_json(report: dict, path: Path) -> None:
    path.write_text(json.dumps(report, indent=2) + "\n")


# ----- results.md -----


def _mib(value: int | None) -> str:
    return "—" if value is None else f"{value / MIB:,.2f} MiB"


def _count(value: int) -> str:
    return f"{value:,}"


def _number(value: float | None) -> str:
    if value is None:
        return "—"
    return "inf" if math.isinf(value) else f"{value:,.1f}"


def _with_ratio(text: str, ratio: float | None) -> str:
    return text if ratio is None else f"{text} (×{ratio:.2f})"


def _strategy_row(run: dict) -> list[str]:
    ratios = run["ratios_vs_none"]
    wikitext = (
        "missing"
        if run["wikitext_missing"]
        else _with_ratio(_number(run["wikitext_perplexity"]), ratios["wikitext_perplexity"])
    )
    overhead = (
        "—"
        if run["agent_overhead_share"] is None
        else f"{100 * run['agent_overhead_share']:.1f}% ({run['tying_seconds']:.1f} s)"
    )
    return [
        f"`{run['strategy']}`",
        f"`{run['map_text']}`",
        _with_ratio(str(run["distinct_blocks"]), ratios["distinct_blocks"]),
        _with_ratio(_count(run["block_parameters"]), ratios["block_parameters"]),
        _with_ratio(_count(run["trainable_parameters"]), ratios["trainable_parameters"]),
        _with_ratio(_number(run["shakespeare_perplexity"]), ratios["shakespeare_perplexity"]),
        wikitext,
        _with_ratio(_mib(run["state_bytes"]["total"]), ratios["state_bytes_total"]),
        _with_ratio(_mib(run["analytic_floor_bytes"]), ratios["analytic_floor_bytes"]),
        _with_ratio(_mib(run["peak_memory_bytes"]), ratios["peak_memory_bytes"]),
        _with_ratio(f"{run['tokens_per_second']:,.0f}", ratios["tokens_per_second"]),
        _with_ratio(_mib(run["checkpoint_bytes"]), ratios["checkpoint_bytes"]),
        overhead,
    ]


STRATEGY_HEADER = [
    "strategy",
    "final map",
    "distinct blocks",
    "trainable block params",
    "trainable params",
    "Shakespeare val. ppl",
    "WikiText-2 test ppl",
    "params+grads+Adam (measured)",
    "analytic floor",
    "peak memory",
    "train tokens/s",
    "checkpoint (safetensors)",
    "agent overhead",
]
MEMORY_HEADER = [
    "blocks L",
    "distinct U",
    "trainable params",
    "params+grads+Adam (measured)",
    "analytic floor",
    "measured / floor",
    "measured vs U = L",
]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(row) + " |" for row in rows
    ]


def _memory_rows(sweep: list[dict], with_cuda_peak: bool) -> list[list[str]]:
    untied = {
        row["num_blocks"]: row["state_bytes"]["total"] for row in sweep if row["distinct_blocks"] == row["num_blocks"]
    }
    rows = []
    for row in sweep:
        measured = row["state_bytes"]["total"]
        reference = untied.get(row["num_blocks"])
        cells = [
            str(row["num_blocks"]),
            str(row["distinct_blocks"]),
            _count(row["trainable_parameters"]),
            _mib(measured),
            _mib(row["analytic_floor_bytes"]),
            f"{measured / row['analytic_floor_bytes']:.4f}",
            "—" if reference is None else f"×{measured / reference:.2f}",
        ]
        rows.append(cells + [_mib(row["cuda_peak_bytes"])] if with_cuda_peak else cells)
    return rows


def markdown(report: dict) -> str:
    settings, machine = report["settings"], report["hardware"]
    lines = [
        f"# hf-layertie bench: preset `{report['preset']}`",
        "",
        f"Measured on {machine['cpu']} ({machine['cpu_cores']} cores"
        + (f", GPU {machine['gpu']}" if machine["gpu"] else ", no GPU")
        + f"), torch {machine['torch']}, transformers {machine['transformers']}; "
        + f"whole bench {report['wall_seconds'] / 60:.1f} min.",
        "",
        f"Settings: {', '.join(f'{key}={value}' for key, value in settings.items())}.",
    ]
    runs = report["runs"]
    if runs:
        dlt = next(run for run in runs if run["strategy"] == "dlt")
        lines += [
            "",
            "## Strategies side by side",
            "",
            f"Every run: {settings['n_layer']} blocks, n_embd {settings['n_embd']}, the same data, seed and "
            f"{settings['max_steps']} optimizer steps, trained by `TyingTrainer`, each in its own process. "
            f"U = {dlt['distinct_blocks']}, the distinct blocks DLT ended with. "
            "(×r) = this run / the `none` run. See bench/README.md for what each column measures.",
            "",
            *_table(STRATEGY_HEADER, [_strategy_row(run) for run in runs]),
        ]
        missing = {run["wikitext_missing"] for run in runs if run["wikitext_missing"]}
        if missing:
            lines += [
                "",
                f"WikiText-2 perplexity is missing: no file at {', '.join(sorted(missing))} (see --wikitext_file).",
            ]
        kinds = {run["peak_memory_kind"] for run in runs}
        lines += ["", "Peak memory: " + ", ".join(sorted(kinds)) + " of the run's own process (see bench/README.md)."]
    if report["memory_sweep"]:
        with_cuda_peak = any(row["cuda_peak_bytes"] is not None for row in report["memory_sweep"])
        header = MEMORY_HEADER + ["CUDA peak allocated"] if with_cuda_peak else MEMORY_HEADER
        lines += [
            "",
            "## Memory against distinct blocks",
            "",
            f"`static:sequence:U` on deep models (n_embd {settings['memory_n_embd']}), "
            f"{settings['memory_steps']} steps each; "
            "measured from the live tensors after the last optimizer step. "
            "Floor = 4 × 4 bytes × (non-block params + U × params per block).",
            "",
            *_table(header, _memory_rows(report["memory_sweep"], with_cuda_peak)),
        ]
    return "\n".join(lines) + "\n"


# ----- plots -----

STYLE = {"none": ("black", "*"), "dlt": ("tab:red", "o"), "random": ("tab:orange", "D")}


def _spread(positions: list[float], min_gap: float) -> list[float]:
    """Move sorted label positions apart until neighbours are at least `min_gap` apart (keeps their order)."""
    spread = list(positions)
    for index in range(1, len(spread)):
        spread[index] = max(spread[index], spread[index - 1] + min_gap)
    shift = (sum(spread) - sum(positions)) / len(spread)  # re-centre on the points
    return [position - shift for position in spread]


def _label_points(axis, points: dict[tuple[float, float], str]) -> None:
    """Labels in one column right of the points, in the points' vertical order, spread so that none overlap,
    each joined to its point by a thin line."""
    (xmin, xmax), (ymin, ymax) = axis.get_xlim(), axis.get_ylim()
    label_x = xmax + 0.12 * (xmax - xmin)
    ordered = sorted(points.items(), key=lambda item: item[0][1])
    label_ys = _spread([y for (_, y), _ in ordered], min_gap=0.06 * (ymax - ymin))
    for ((x, y), label), label_y in zip(ordered, label_ys, strict=True):
        axis.annotate(
            label,
            (x, y),
            xytext=(label_x, label_y),
            fontsize=9,
            va="center",
            arrowprops={"arrowstyle": "-", "color": "0.65", "lw": 0.6, "shrinkA": 2, "shrinkB": 5},
        )
    axis.set_xlim(xmin, xmax + 0.9 * (xmax - xmin))  # room for the label column
    axis.set_ylim(min(ymin, label_ys[0] - 0.04 * (ymax - ymin)), max(ymax, label_ys[-1] + 0.04 * (ymax - ymin)))


def plot_perplexity_vs_trainable(runs: list[dict], path: Path) -> Path:
    """Perplexity (Shakespeare validation, and WikiText-2 when measured) against trainable parameters."""
    panels = [("shakespeare_perplexity", "Shakespeare validation plays")]
    if any(run["wikitext_perplexity"] is not None for run in runs):
        panels.append(("wikitext_perplexity", "WikiText-2 test (out of domain)"))
    figure, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), 6), squeeze=False)
    for axis, (key, title) in zip(axes[0], panels, strict=True):
        merged: dict[tuple[float, float], list[dict]] = {}  # runs that ended identical share one point and label
        for run in runs:
            if run[key] is not None and math.isfinite(run[key]):
                merged.setdefault((run["trainable_parameters"] / 1e6, run[key]), []).append(run)
        for (x, y), group in merged.items():
            colour, marker = STYLE.get(group[0]["strategy"], ("tab:blue", "s"))
            axis.scatter(x, y, color=colour, marker=marker, s=160 if marker == "*" else 60, zorder=3)
        axis.margins(x=0.08, y=0.1)
        labels = {
            point: " = ".join(run["strategy"] for run in group) + f" (U={group[0]['distinct_blocks']})"
            for point, group in merged.items()
        }
        _label_points(axis, labels)
        axis.set_xlabel("trainable parameters (millions)")
        axis.set_ylabel("perplexity (lower is better)")
        axis.set_title(title)
        axis.grid(alpha=0.3)
    figure.suptitle("Perplexity after training vs trainable parameters, one point per strategy")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def plot_memory_vs_distinct(sweep: list[dict], path: Path) -> Path:
    """Measured params+grads+Adam bytes against the analytic floor as U grows, absolute and relative to untied."""
    figure, (absolute, relative) = plt.subplots(1, 2, figsize=(14, 5.5))
    colours = plt.get_cmap("tab10")
    depths = sorted({row["num_blocks"] for row in sweep})
    for index, depth in enumerate(depths):
        rows = sorted((row for row in sweep if row["num_blocks"] == depth), key=lambda row: row["distinct_blocks"])
        distinct = [row["distinct_blocks"] for row in rows]
        measured = [row["state_bytes"]["total"] for row in rows]
        floor = [row["analytic_floor_bytes"] for row in rows]
        untied = measured[-1] if distinct[-1] == depth else None
        style = {
            "color": colours(index),
            "markersize": 11 - 4 * index,
            "markerfacecolor": "none" if index == 0 else colours(index),
        }
        absolute.plot(
            distinct,
            [value / MIB for value in floor],
            "--",
            color=colours(index),
            lw=1.2,
            label=f"L={depth}: analytic floor",
        )
        absolute.plot(distinct, [value / MIB for value in measured], "o", label=f"L={depth}: measured", **style)
        if untied:
            relative.plot(
                distinct,
                [value / untied for value in floor],
                "--",
                color=colours(index),
                lw=1.2,
                label=f"L={depth}: analytic floor",
            )
            relative.plot(distinct, [value / untied for value in measured], "o", label=f"L={depth}: measured", **style)
    ticks = sorted({row["distinct_blocks"] for row in sweep})
    for axis in (absolute, relative):
        axis.set_xscale("log", base=2)
        axis.set_xticks(ticks, [str(tick) for tick in ticks])
        axis.set_xlabel("distinct blocks U (log scale)")
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        axis.legend(loc="lower right")
    absolute.set_ylabel("parameters + gradients + Adam state (MiB)")
    absolute.set_title("Training state, measured from the live tensors")
    relative.set_ylabel("fraction of the untied model (U = L)")
    relative.set_title("Relative to training every block independently")
    figure.suptitle("Memory vs distinct blocks (static:sequence:U, fp32 AdamW)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
