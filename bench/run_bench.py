#!/usr/bin/env python
"""Every tying strategy trained side by side and measured, in one command.

    python bench/run_bench.py --preset tiny      # the whole bench in under 2 minutes on 2 CPU cores
    python bench/run_bench.py --preset default   # 12 blocks, about an hour on 2 CPU cores
    python bench/run_bench.py --preset gpu       # GPT-2 small's shape, on a GPU
    python bench/run_bench.py --help             # every flag

DLT runs first; then conventional training (`none`), `random` and the static strategies, those with U
distinct blocks taking U from DLT's final map. Each run is a fresh Python process (this script again, with
`--single_run STRATEGY`), so its peak memory is its own. A memory sweep over deep models follows. Outputs:
results.md, results.json, perplexity_vs_trainable.png and memory_vs_distinct.png in --results_dir.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the Hub: never wait for its time-outs
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import dataclasses  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

if __package__ in (None, ""):  # run as `python bench/run_bench.py`: make the `bench` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import HfArgumentParser  # noqa: E402

from bench import report  # noqa: E402
from bench.settings import (  # noqa: E402
    BenchArguments,
    compared_strategies,
    resolve_settings,
    results_dir,
    wikitext_path,
)

RESULTS_MD = "results.md"
RESULTS_JSON = "results.json"
PERPLEXITY_PLOT = "perplexity_vs_trainable.png"
MEMORY_PLOT = "memory_vs_distinct.png"


def run_name(strategy: str) -> str:
    """A folder name for a strategy: `static:cycle:3` -> `static-cycle-3`."""
    return strategy.replace(":", "-")


def run_in_subprocess(strategy: str, argv: list[str], output_dir: Path) -> dict:
    """Run this script with `--single_run strategy` in a fresh interpreter; return the JSON it writes.

    The run's log and its tying history (and tying map plot, for dlt / random) stay in runs/<strategy>/.
    """
    run_dir = output_dir / "runs" / run_name(strategy)
    run_dir.mkdir(parents=True, exist_ok=True)
    result_file = run_dir / "result.json"
    result_file.unlink(missing_ok=True)
    log_file = run_dir / "log.txt"
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        *argv,
        "--single_run",
        strategy,
        "--single_run_output",
        str(result_file),
    ]
    with open(log_file, "w") as log:
        completed = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False)
    if completed.returncode != 0 or not result_file.is_file():
        tail = "\n".join(log_file.read_text().splitlines()[-25:])
        raise RuntimeError(
            f"the {strategy!r} run failed (exit code {completed.returncode}); end of {log_file}:\n{tail}"
        )
    return json.loads(result_file.read_text())


def run_strategies(argv: list[str], output_dir: Path) -> list[dict]:
    """DLT first (its final number of distinct blocks sets U), then every other strategy."""
    started = time.perf_counter()
    runs = [run_in_subprocess("dlt", argv, output_dir)]
    _print_run(runs[0], 1, started)
    others = compared_strategies(runs[0]["distinct_blocks"])
    for index, strategy in enumerate(others, start=2):
        runs.append(run_in_subprocess(strategy, argv, output_dir))
        _print_run(runs[-1], index, started)
    baseline = next(run for run in runs if run["strategy"] == report.BASELINE)
    return [baseline] + [run for run in runs if run is not baseline]


def _print_run(run: dict, index: int, started: float) -> None:
    print(
        f"[{index}] {run['strategy']}: {run['distinct_blocks']} distinct blocks, Shakespeare ppl "
        f"{run['shakespeare_perplexity']:.1f}, {run['tokens_per_second']:,.0f} tokens/s "
        f"({time.perf_counter() - started:.0f} s so far)",
        flush=True,
    )


def single_run(args: BenchArguments) -> None:
    """`--single_run`: train and measure one strategy in this process, write its JSON."""
    from bench.measure import run_strategy  # the heavy imports, only where training happens

    output = Path(args.single_run_output)
    result = run_strategy(resolve_settings(args), args.single_run, output.parent, wikitext_path(args))
    output.write_text(json.dumps(result, indent=2) + "\n")


def main(argv: list[str] | None = None) -> Path:
    """Run the bench; returns the results folder."""
    argv = sys.argv[1:] if argv is None else list(argv)
    (args,) = HfArgumentParser(BenchArguments).parse_args_into_dataclasses(args=argv)
    settings = resolve_settings(args)
    if args.single_run is not None:
        single_run(args)
        return Path(args.single_run_output).parent
    output_dir = results_dir(args)
    output_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    runs = [] if args.memory_only else run_strategies(argv, output_dir)
    sweep = []
    if not args.skip_memory:
        from bench.measure import run_memory_sweep

        print(f"Memory sweep: {', '.join(map(str, settings.memory_depths))} blocks", flush=True)
        sweep = run_memory_sweep(settings)
    if runs:
        report.add_ratios(runs)
        report.plot_perplexity_vs_trainable(runs, output_dir / PERPLEXITY_PLOT)
    if sweep:
        report.plot_memory_vs_distinct(sweep, output_dir / MEMORY_PLOT)
    results = {
        "preset": args.preset,
        "settings": dataclasses.asdict(settings),
        "wikitext_file": str(wikitext_path(args)),
        "hardware": report.hardware(),
        "wall_seconds": time.perf_counter() - started,
        "runs": runs,
        "memory_sweep": sweep,
    }
    report.write_json(results, output_dir / RESULTS_JSON)
    (output_dir / RESULTS_MD).write_text(report.markdown(results))
    print(f"Results in {output_dir}: {RESULTS_MD}, {RESULTS_JSON} and the plots", flush=True)
    return output_dir


if __name__ == "__main__":
    main()
