#!/usr/bin/env python
"""`--torch_compile` under DLT: eager, the whole model compiled, and each block compiled on its own, side by side.

    python bench/compile.py                   # 6 blocks of width 128, 12 steps, a decision every 2 (inductor)
    python bench/compile.py --max_steps 24 --backend aot_eager
    python bench/compile.py --use_gpu         # on a CUDA GPU, into bench/reports/compile/gpu

Each mode trains the same DLT run in a fresh single-threaded process with an empty inductor cache (so each compiles
from nothing, as a first run does, and two threads do not fight over a shared machine) through the study's path
(`TyingTrainer`, the study's tokenizer, works and model builder from `bench/measure.py`), at the sizes of
`run_clm.py`'s default model:

- `eager`: no compilation;
- `whole`: `torch_compile` as transformers' Trainer does it, `torch.compile` of the whole model (the same dynamo
  plugin with `use_regional_compilation=False`);
- `regional`: `torch_compile` as `TyingTrainer` does it for tied models, each block compiled on its own
  (accelerate's `compile_regions`, `hf_layertie/trainer/compilation.py`).

Per mode it reports the training time (`Trainer.train`, compilation included), the first step's time, the median
time of the steps that compiled nothing, the steps that compiled a graph, the distinct maps the run trained under,
and dynamo's counts (frames compiled, graphs, recompiles), with each mode's training time over eager's, into
`--output_dir` (`results.json`, `results.md`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
from torch._dynamo import convert_frame
from torch._dynamo.utils import counters
from transformers import TrainerCallback

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
MODES = ("eager", "whole", "regional")
SIZES = ("n_layer", "n_embd", "n_head", "block_size", "batch_size", "max_steps", "tying_interval", "backend", "seed")

from bench.markdown_tables import refresh_markdown  # noqa: E402
from bench.measure import build_model, study_data  # noqa: E402
from hf_layertie import TyingTrainer, TyingTrainingArguments  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n_layer", type=int, default=6)
    parser.add_argument("--n_embd", type=int, default=128)
    parser.add_argument("--n_head", type=int, default=4)
    parser.add_argument("--block_size", type=int, default=64, help="Tokens per example (the model's context).")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--max_steps", type=int, default=12)
    parser.add_argument("--tying_interval", type=int, default=2, help="Optimizer steps between two DLT decisions.")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (torch_compile_backend).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--use_gpu", action="store_true", help="Train on the CUDA GPU (the study's setting `use_gpu`).")
    parser.add_argument("--output_dir", help="Default: bench/reports/compile, or bench/reports/compile/gpu with --use_gpu.")
    parser.add_argument("--mode", choices=MODES, help="Internal: the mode this process measures.")
    args = parser.parse_args()
    if args.max_steps < 2 or args.tying_interval < 1:  # a step after the first, which compiles, for the median
        parser.error("--max_steps must be at least 2 and --tying_interval at least 1")
    if args.use_gpu and not torch.cuda.is_available():
        parser.error("--use_gpu: torch sees no CUDA GPU here")
    if args.output_dir is None:
        args.output_dir = str(REPO_ROOT / "bench" / "reports" / "compile" / ("gpu" if args.use_gpu else ""))
    if args.mode is not None:
        measure(args)
        return
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    runs = {mode: run_mode(args, mode, output_dir) for mode in MODES}
    write_report(args, runs, output_dir)
    refresh_markdown()


def run_mode(args, mode: str, output_dir: Path) -> dict:
    """Measure `mode` in a fresh process, single-threaded, with an inductor cache of its own; its record."""
    print(f"[{mode}] training {args.max_steps} steps ...", flush=True)
    flags = [f"--{name}={getattr(args, name)}" for name in (*SIZES, "output_dir")] + ["--use_gpu"] * args.use_gpu
    with tempfile.TemporaryDirectory() as inductor_cache:  # compiled kernels and graphs of no earlier run
        offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        environment = {**os.environ, **offline, "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_CACHE_DIR": inductor_cache}
        started = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--mode", mode, *flags], check=True, env=environment)
        process_seconds = time.perf_counter() - started
    path = output_dir / f"{mode}.json"
    record = {**json.loads(path.read_text()), "process_seconds": process_seconds}
    path.unlink()  # kept in results.json
    return record


def measure(args) -> None:
    """Train the DLT run under `args.mode` and write what `CompileMeter` saw to `<output_dir>/<mode>.json`."""
    tokenizer, blocks = study_data(args.block_size, max_test_blocks=0, max_validation_blocks=0)
    torch.manual_seed(args.seed)
    model = build_model(tokenizer, args.n_layer, args.n_embd, args.n_head, args.block_size)
    compiled = {} if args.mode == "eager" else {"torch_compile_backend": args.backend}
    with tempfile.TemporaryDirectory() as output_dir:
        training_args = TyingTrainingArguments(
            output_dir=output_dir, tying_strategy="dlt", tying_interval=args.tying_interval, max_steps=args.max_steps,
            per_device_train_batch_size=args.batch_size, learning_rate=3e-3, seed=args.seed, data_seed=args.seed,
            use_cpu=not args.use_gpu, save_strategy="no", report_to=[], disable_tqdm=True, logging_steps=args.max_steps,
            tying_plot=False, **compiled,
        )  # fmt: skip
        meter = CompileMeter(model, synchronize=torch.cuda.synchronize if args.use_gpu else lambda: None)
        trainer_class = WholeModelTrainer if args.mode == "whole" else TyingTrainer
        trainer = trainer_class(model=model, args=training_args, train_dataset=blocks["train"], callbacks=[meter])
        started = time.perf_counter()
        trainer.train()
        train_seconds = time.perf_counter() - started
    device = torch.cuda.get_device_name() if args.use_gpu else "CPU"
    threads = torch.get_num_threads()
    result = {"mode": args.mode, "train_seconds": train_seconds, "device": device, "threads": threads}
    result.update(meter.summary())
    Path(args.output_dir, f"{args.mode}.json").write_text(json.dumps(result, indent=1))


class WholeModelTrainer(TyingTrainer):
    """`TyingTrainer` with the Trainer's own compilation: `torch.compile` of the whole model."""

    def _build_accelerator_args(self, **kwargs) -> dict:
        accelerator_args = super()._build_accelerator_args(**kwargs)
        accelerator_args["dynamo_plugin"].use_regional_compilation = False
        return accelerator_args


def compile_counts() -> dict[str, int]:
    """Dynamo's counts so far: frames compiled (first compiles and recompiles), graphs, and recompiles (compiles of a
    function dynamo had compiled before, as TORCH_LOGS=recompiles numbers them: `[function/compile]`, compile > 0;
    torch 2.13's private counter of them, `convert_frame.FRAME_COMPILE_COUNTER`)."""
    return {
        "frames": counters["frames"]["ok"],
        "graphs": counters["stats"]["unique_graphs"],
        "recompiles": sum(count - 1 for count in convert_frame.FRAME_COMPILE_COUNTER.values()),
    }


class CompileMeter(TrainerCallback):
    """Per optimizer step: its wall time, the map it trained under and whether it compiled a graph. On a GPU,
    `synchronize` waits for the step's kernels, which run after the Python that launched them has returned."""

    def __init__(self, model, synchronize: Callable[[], None]):
        self.model = model
        self.synchronize = synchronize
        self.seconds: list[float] = []
        self.maps: list[tuple[int, ...]] = []
        self.compiled: list[bool] = []
        self._started = 0.0
        self._graphs = 0

    def on_step_begin(self, args, state, control, **kwargs):
        self._graphs = compile_counts()["graphs"]
        self.synchronize()
        self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.synchronize()
        self.seconds.append(time.perf_counter() - self._started)
        self.maps.append(tuple(self.model.tying_map))
        self.compiled.append(compile_counts()["graphs"] > self._graphs)

    def summary(self) -> dict:
        steady = [seconds for seconds, compiled in zip(self.seconds, self.compiled) if not compiled]
        return {
            **compile_counts(),
            "first_step_seconds": self.seconds[0],
            "median_step_ms": 1000 * statistics.median(steady) if steady else None,
            "steps_compiling": sum(self.compiled),
            "distinct_maps": len(set(self.maps)),
            "maps": [" ".join(map(str, entries)) for entries in self.maps],
            "step_seconds": self.seconds,
        }


def write_report(args, runs: dict, output_dir: Path) -> None:
    """`results.json` (the set-up and every mode's record, by mode: what bench/README.md's table reads) and
    `results.md`, each mode's training time also over eager's."""
    eager = runs["eager"]["train_seconds"]
    for run in runs.values():
        run["train_seconds_over_eager"] = run["train_seconds"] / eager
    setup = (
        f"TiedGPT2, {args.n_layer} blocks x width {args.n_embd} ({args.n_head} heads), DLT deciding every "
        f"{args.tying_interval} steps from all blocks tied, {args.max_steps} AdamW steps of {args.batch_size} x "
        f"{args.block_size} tokens (the study's works and tokenizer), backend {args.backend}, "
        f"{runs['eager'].get('device', 'CPU')}, {runs['eager']['threads']} torch thread(s), one fresh process and an "
        "empty inductor cache per mode"
    )
    labels = {"eager": "eager", "whole": "whole model compiled", "regional": "each block compiled (regional)"}
    lines = [
        "# --torch_compile under DLT: eager, whole-model and regional compilation",
        "",
        setup,
        "",
        "| mode | training (s) | over eager | first step (s) | median step without compiling (ms) | steps compiling | "
        "distinct maps | frames compiled | graphs | recompiles |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, run in runs.items():
        median = "-" if run["median_step_ms"] is None else f"{run['median_step_ms']:,.0f}"
        lines.append(
            f"| {labels[mode]} | {run['train_seconds']:,.1f} | {run['train_seconds_over_eager']:.2f} | "
            f"{run['first_step_seconds']:,.1f} | {median} | {run['steps_compiling']} | {run['distinct_maps']} | "
            f"{run['frames']} | {run['graphs']} | {run['recompiles']} |"
        )
    (output_dir / "results.md").write_text("\n".join(lines) + "\n")
    (output_dir / "results.json").write_text(json.dumps({"setup": setup, "rows": runs}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
