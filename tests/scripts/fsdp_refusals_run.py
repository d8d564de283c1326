"""FSDP2 on two gloo processes (torchrun): misuses of a sharded tied model raise on every rank instead of blocking,
and leave the model and the process group as they were (a re-tie and a training step follow them).

Launched by tests/test_sharding.py under a timeout: `torchrun --nproc_per_node 2 tests/scripts/fsdp_refusals_run.py
OUTPUT_DIR`. Each rank writes OUTPUT_DIR/rank<rank>.pt: the error each misuse raised there, or None.
"""

import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from launched import run_then_exit
from torch.distributed.device_mesh import init_device_mesh

from hf_layertie import TiedGPT2Config, TiedGPT2LMHeadModel
from hf_layertie.sharding import retie_sharded, shard_tied_model

CONFIG = dict(n_layer=4, n_embd=16, n_head=2, n_positions=32, vocab_size=50, tying_map=[0, 0, 0, 0])


def raised(call) -> str | None:
    """What `call()` raised, as `Type: message`, or None: recorded rather than raised, so every misuse runs."""
    try:
        call()
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return None


def main():
    output_dir = Path(sys.argv[1])
    # A rank left alone in a collective raises after this, rather than waiting for the test's timeout to end it.
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    early = TiedGPT2LMHeadModel(TiedGPT2Config(**CONFIG))
    early_optimizer = torch.optim.AdamW(early.parameters())
    shard_tied_model(early, mesh=mesh)
    model = shard_tied_model(TiedGPT2LMHeadModel(TiedGPT2Config(**CONFIG)), mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters())

    results = {"save_on_every_rank": raised(lambda: model.save_pretrained(output_dir / "saved_on_every_rank"))}
    if rank == 0:
        results["save_on_rank_0"] = raised(lambda: model.save_pretrained(output_dir / "saved_on_rank_0"))
    dist.barrier()
    results["different_maps"] = raised(lambda: retie_sharded(model, optimizer, [[0, 0, 2, 2], [0, 1, 2, 3]][rank]))
    results["invalid_map_on_rank_1"] = raised(lambda: retie_sharded(model, optimizer, [[0, 1, 2, 3], [0, 0, 5, 0]][rank]))
    results["optimizer_built_before_sharding"] = raised(lambda: retie_sharded(early, early_optimizer, [0, 1, 2, 3]))
    results["optimizer_of_another_model"] = raised(lambda: retie_sharded(early, optimizer, [0, 1, 2, 3]))

    model = retie_sharded(model, optimizer, [0, 1, 2, 3])
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(rank))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    results["map_after"] = model.tying_map.to_list()
    torch.save(results, output_dir / f"rank{rank}.pt")


if __name__ == "__main__":
    run_then_exit(main)
