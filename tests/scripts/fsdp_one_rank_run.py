"""FSDP2 on two gloo processes (torchrun): `gather_tied_model` and `retie_sharded` called on rank 0 alone raise
there, naming the misuse, instead of blocking (gather) or ending in a bare gloo error (re-tie).

Launched by tests/test_sharding.py under a timeout: `torchrun --nproc_per_node 2 tests/scripts/fsdp_one_rank_run.py
OUTPUT_DIR`. Each rank writes OUTPUT_DIR/rank<rank>.pt: the error each misuse raised on rank 0 (rank 1: nothing).
"""

import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from fsdp_refusals_run import CONFIG, raised
from launched import run_then_exit
from torch.distributed.device_mesh import init_device_mesh

from hf_layertie import TiedGPT2Config, TiedGPT2LMHeadModel
from hf_layertie.sharding import gather_tied_model, retie_sharded, shard_tied_model

ARRIVAL = timedelta(seconds=3)


def main():
    output_dir = Path(sys.argv[1])
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    model = shard_tied_model(TiedGPT2LMHeadModel(TiedGPT2Config(**CONFIG)), mesh=init_device_mesh("cpu", (2,)))
    optimizer = torch.optim.AdamW(model.parameters())
    results = {}
    if rank == 0:  # as a user saving "from rank 0" would
        results["gather_on_rank_0"] = raised(lambda: gather_tied_model(model, arrival_timeout=ARRIVAL))
        results["retie_on_rank_0"] = raised(lambda: retie_sharded(model, optimizer, [0, 1, 2, 3], arrival_timeout=ARRIVAL))
    else:
        time.sleep(4 * ARRIVAL.total_seconds())  # alive, elsewhere, while rank 0 waits
    torch.save(results, output_dir / f"rank{rank}.pt")


if __name__ == "__main__":
    run_then_exit(main)
