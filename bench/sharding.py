#!/usr/bin/env python
"""FSDP2 against DDP for a deep tied model on two processes: training memory per rank and time per re-tie.

    python bench/sharding.py                      # 48 blocks of width 128, 8 distinct, 2 gloo processes (CPU)
    python bench/sharding.py --n_layer 24 --reties 4

Each mode runs in its own `torchrun` launch (so each process's peak resident memory is its own), trains a tied
GPT-2 whose 48 blocks share 8 distinct weight sets, and re-ties it back and forth between two maps with 8 distinct
blocks (`sequence:8` and `cycle:8`), training a few steps after each:

- `ddp`: every rank holds the whole model; a re-tie is `model.retie`, `sync_optimizer_with_model` and
  `rebuild_data_parallel`;
- `fsdp`: `shard_tied_model` (one FSDP2 group per tie group); a re-tie is `retie_sharded` (a round trip through the
  full state), the engine's `ShardedRetie` policy.

Both re-tie through `TyingEngine.retie_to`, the engine `TyingTrainer` and a plain loop train with, so what is timed
is what training does.

It reports, per rank, the training state held (parameters + gradients + AdamW state, the local shards under
FSDP2, each shared tensor once; under DDP also its reducer's gradient buckets, which hold a second copy of the
gradients unless `gradient_as_bucket_view`, sized by DDP's own logging data), the process's resident high-water mark
(`VmHWM`), and the median time of a re-tie, side by side with their ratios, into `--output_dir` (`results.json`,
`results.md`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
MODES = ("ddp", "fsdp")

from bench.markdown_tables import MIB, refresh_markdown  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n_layer", type=int, default=48)
    parser.add_argument("--n_embd", type=int, default=128)
    parser.add_argument("--distinct", type=int, default=8, help="Distinct blocks of both maps.")
    parser.add_argument("--reties", type=int, default=6, help="Re-ties timed per mode.")
    parser.add_argument("--steps", type=int, default=2, help="Optimizer steps after each re-tie.")
    parser.add_argument("--output_dir", default=str(REPO_ROOT / "bench" / "reports" / "sharding"))
    parser.add_argument("--mode", choices=MODES, help="Internal: the mode this torchrun process measures.")
    args = parser.parse_args()
    if args.mode is not None:
        measure(args)
        return
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    runs = {}
    for mode in MODES:
        print(f"[{mode}] torchrun --nproc_per_node 2 ...", flush=True)
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", __file__, "--mode", mode]
        command += [f"--{name}={getattr(args, name)}" for name in ("n_layer", "n_embd", "distinct", "reties", "steps", "output_dir")]
        subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
        rank_files = [output_dir / f"{mode}-rank{rank}.json" for rank in (0, 1)]
        runs[mode] = [json.loads(path.read_text()) for path in rank_files]
        for path in rank_files:  # kept in results.json
            path.unlink()
    write_report(args, runs, output_dir)
    refresh_markdown()


def measure(args) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.parallel import DistributedDataParallel

    from hf_layertie import TiedGPT2Config, TiedGPT2LMHeadModel, parse_strategy
    from hf_layertie.decisions import StrategySettings, TyingDecisions
    from hf_layertie.engine import DistributedProcesses, TyingEngine
    from hf_layertie.sharding import ShardedRetie, shard_tied_model
    from hf_layertie.trainer import rebuild_data_parallel

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    maps = [parse_strategy(f"{name}:{args.distinct}", args.n_layer) for name in ("sequence", "cycle")]
    torch.manual_seed(0)
    config = TiedGPT2Config(
        n_layer=args.n_layer, n_embd=args.n_embd, n_head=4, n_positions=64, vocab_size=2048, tying_map=maps[0].to_list()
    )
    model = TiedGPT2LMHeadModel(config)
    if args.mode == "fsdp":
        wrapped = shard_tied_model(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    else:
        wrapped = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    # No strategy decides here: the benchmark gives the maps (`retie_to`), and the engine applies them.
    engine = TyingEngine(
        model, TyingDecisions(StrategySettings(), args.n_layer), DistributedProcesses(), output_dir=args.output_dir, optimizer=lambda: optimizer,
        refresh_wrapper=lambda: rebuild_data_parallel(wrapped) if args.mode == "ddp" else None,
        held_out_loss=lambda: float("nan"), prepare_inputs=lambda batch: batch, steps=lambda: (0, 0), log=lambda logs: None,
        retie=ShardedRetie() if args.mode == "fsdp" else None,
    )  # fmt: skip
    batch = torch.randint(0, 2048, (4, 64), generator=torch.Generator().manual_seed(rank))
    peak_state, seconds = 0, []

    def train():
        nonlocal peak_state
        for _ in range(args.steps):
            wrapped(input_ids=batch, labels=batch).loss.backward()
            optimizer.step()
            peak_state = max(peak_state, training_state_bytes(wrapped, optimizer) + ddp_bucket_bytes(wrapped))
            optimizer.zero_grad(set_to_none=False)

    train()
    for index in range(args.reties):
        tying_map = maps[(index + 1) % 2]
        dist.barrier()
        started = time.perf_counter()
        engine.retie_to(tying_map)
        if args.mode == "fsdp":
            wrapped = engine.model  # a new sharded model after each re-tie
        dist.barrier()
        seconds.append(time.perf_counter() - started)
        train()
    result = {
        "mode": args.mode,
        "rank": rank,
        "peak_state_bytes": peak_state,
        "ddp_bucket_bytes": ddp_bucket_bytes(wrapped),  # in peak_state_bytes; 0 under FSDP2
        "peak_process_bytes": resident_high_water_mark(),
        "retie_seconds_median": statistics.median(seconds),
        "retie_seconds": seconds,
    }
    Path(args.output_dir, f"{args.mode}-rank{rank}.json").write_text(json.dumps(result, indent=1))
    dist.destroy_process_group()


def training_state_bytes(model, optimizer) -> int:
    """Parameters, gradients and optimizer state this process holds (local shards of DTensors), each tensor once."""
    import torch

    def local(tensor):
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor

    seen, total = set(), 0
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
    tensors += [value for state in optimizer.state.values() for value in state.values() if torch.is_tensor(value)]
    for tensor in tensors:
        tensor = local(tensor)
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total


def ddp_bucket_bytes(wrapped) -> int:
    """The bytes of a DDP wrapper's gradient buckets (`bucket_sizes` of `_get_ddp_logging_data`, DDP's record of
    its reducer): the reducer all-reduces gradients in these flat buffers, a copy beside each `.grad` unless
    `gradient_as_bucket_view` makes the gradients views of them (then counted with the gradients). 0 when not DDP."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(wrapped, DistributedDataParallel):
        return 0
    logged = wrapped._get_ddp_logging_data()
    if logged.get("gradient_as_bucket_view"):
        return 0
    return sum(int(size) for size in str(logged["bucket_sizes"]).split(",") if size)


def resident_high_water_mark() -> int:
    """`VmHWM` of this process (Linux), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def write_report(args, runs: dict, output_dir: Path) -> None:
    rows = {
        mode: {
            "peak_state_mib_per_rank": max(run["peak_state_bytes"] for run in ranks) / MIB,
            "peak_process_mib_per_rank": max(run["peak_process_bytes"] for run in ranks) / MIB,
            "retie_ms_median": 1000 * max(run["retie_seconds_median"] for run in ranks),
        }
        for mode, ranks in runs.items()
    }
    setup = (
        f"TiedGPT2, {args.n_layer} blocks x width {args.n_embd}, maps sequence:{args.distinct} <-> cycle:{args.distinct}, "
        f"AdamW, batch 4 x 64 per rank, 2 gloo processes on CPU (torchrun), {args.reties} re-ties"
    )
    lines = [
        "# FSDP2 against DDP for a tied model, 2 processes",
        "",
        setup,
        "",
        "| | DDP | FSDP2 | FSDP2 / DDP |",
        "|---|---|---|---|",
    ]
    for key, label in (
        ("peak_state_mib_per_rank", "training state per rank (MiB, peak)"),
        ("peak_process_mib_per_rank", "process resident peak per rank (MiB, VmHWM)"),
        ("retie_ms_median", "re-tie (ms, median)"),
    ):
        ddp, fsdp = rows["ddp"][key], rows["fsdp"][key]
        lines.append(f"| {label} | {ddp:,.1f} | {fsdp:,.1f} | {fsdp / ddp:.2f} |")
    (output_dir / "results.md").write_text("\n".join(lines) + "\n")
    (output_dir / "results.json").write_text(json.dumps({"setup": setup, "summary": rows, "runs": runs}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
