"""`DistributedProcesses` on two gloo processes (torchrun): each collective, and a failure on one rank raised on both.

Launched by tests/engine/test_processes.py under a timeout: `torchrun --nproc_per_node 2 tests/scripts/processes_run.py
OUTPUT_DIR`. Each rank writes OUTPUT_DIR/rank<rank>.pt: what each collective returned there, and the error the failure
raised there.
"""

import sys

import torch
import torch.distributed as dist

from hf_layertie.engine import DistributedProcesses


def main(output_dir: str) -> None:
    dist.init_process_group("gloo")
    processes = DistributedProcesses()
    rank = processes.process_index
    measured = {
        "num_processes": processes.num_processes,
        "is_main_process": processes.is_main_process,
        "broadcast": processes.broadcast(f"from rank {rank}"),
        "gather": processes.gather(rank + 0.5),
        "mean": processes.mean(float(rank)),
        "computed": processes.on_every_process(lambda: rank * 10, step=3),
    }

    def fails_on_rank_1() -> int:
        if rank == 1:
            raise ValueError("no map")
        return 1

    try:
        processes.on_every_process(fails_on_rank_1, step=7)
    except Exception as error:
        measured["failure"] = f"{type(error).__name__}: {error}"
    torch.save(measured, f"{output_dir}/rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
