"""DLT in a plain PyTorch loop over a model sharded with FSDP2, driven by `TyingEngine` (docs/training.md).

    torchrun --nproc_per_node 2 docs/examples/dlt_fsdp2_loop.py OUTPUT_DIR   # sharded, 2 gloo processes on CPU
    python docs/examples/dlt_fsdp2_loop.py OUTPUT_DIR                        # the same loop, one process, unsharded

Each process trains on its share of the same global batches. Under FSDP2 a re-tie builds a new sharded model
(`retie_sharded`), so the loop reads `engine.model` after each `decide_if_due`; the optimizer object is kept, its
state carried over. Each process writes OUTPUT_DIR/rank<r>.pt: the map after every step and the full final weights.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from hf_layertie import TiedGPT2Config, TiedGPT2LMHeadModel, TyingTrainingArguments, gather_tied_model, shard_tied_model
from hf_layertie.engine import DistributedProcesses, Processes, TyingEngine
from hf_layertie.sharding import ShardedRetie

output_dir = sys.argv[1]
sharded = "WORLD_SIZE" in os.environ  # launched by torchrun
if sharded:
    dist.init_process_group("gloo")
rank, world = (dist.get_rank(), dist.get_world_size()) if sharded else (0, 1)

torch.manual_seed(0)  # the same starting weights on every process
config = TiedGPT2Config(
    n_layer=6, n_embd=32, n_head=2, n_positions=32, vocab_size=256, bos_token_id=0, eos_token_id=0,
    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
)  # fmt: skip
model = TiedGPT2LMHeadModel(config)
if sharded:
    shard_tied_model(model, mesh=init_device_mesh("cpu", (world,)))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)  # after sharding, over the sharded Parameters
max_steps, step = 12, 0
# The strategy and its settings, as the Trainer's flags give them (output_dir: where tying_history.jsonl goes).
args = TyingTrainingArguments(output_dir=output_dir, tying_strategy="dlt", tying_interval=2, max_distinct_blocks=3, max_steps=max_steps)  # fmt: skip
engine = TyingEngine(
    model, args.tying_decisions(len(model.tied_blocks)), DistributedProcesses() if sharded else Processes(),
    output_dir=args.output_dir, optimizer=lambda: optimizer, refresh_wrapper=lambda: None,
    held_out_loss=lambda: float("nan"), prepare_inputs=lambda batch: batch, steps=lambda: (step, max_steps),
    log=print if rank == 0 else lambda logs: None,
    retie=ShardedRetie() if sharded else None,  # FSDP2: re-tie by retie_sharded, which returns a new model
)  # fmt: skip
engine.start()  # DLT's starting map: every block tied to block 0
data = torch.Generator().manual_seed(1)
maps = []
for step in range(max_steps):
    batch = torch.randint(0, 256, (8, 32), generator=data)  # the global batch: this process trains on its share
    engine.decide_if_due({"input_ids": batch})
    model = engine.model  # the model to train from now on (a new one after a sharded re-tie)
    local = batch.chunk(world)[rank]
    loss = model(input_ids=local, labels=local).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    engine.observe_loss(loss.detach())
    maps.append(model.tying_map.to_list())
step = max_steps
engine.finish_decisions(write=rank == 0)
full = gather_tied_model(model) if sharded else model  # collective: every process gathers
results = {"maps": maps, "weights": full.state_dict(), "decisions": len(engine.tying_records)}
torch.save(results, f"{output_dir}/rank{rank}.pt")
print(f"rank {rank}: map {model.tying_map}, {len(engine.tying_records)} decisions")
if sharded:
    dist.destroy_process_group()
    # Everything is written; gloo can still abort a finalizing interpreter (pytorch/pytorch#179291).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
