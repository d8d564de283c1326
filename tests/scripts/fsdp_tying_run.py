"""FSDP2 on two gloo processes (torchrun): a sharded tied model trains as one process training on both ranks' batches,
through static maps of several shapes and a sequence of re-ties; each rank dumps what it measured.

Launched by tests/test_sharding.py: `torchrun --nproc_per_node 2 tests/scripts/fsdp_tying_run.py OUTPUT_DIR`.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from hf_layertie import TiedGPT2Config, TiedGPT2LMHeadModel
from hf_layertie.language_modeling.generated_tasks import evaluate_hop_task
from hf_layertie.sharding import gather_tied_model, retie_sharded, shard_tied_model
from hf_layertie.trainer import sync_optimizer_with_model

output_dir = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
SIZES = dict(n_layer=4, n_embd=16, n_head=2, n_positions=32, vocab_size=50, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
batches = torch.randint(0, 50, (64, 2 * world, 8), generator=torch.Generator().manual_seed(1))


def train_steps(sharded, optimizer, reference, reference_optimizer, first, count):
    """`count` AdamW steps: the sharded model on this rank's half of each batch, the reference on all of it."""
    losses = []
    for index in range(first, first + count):
        batch = batches[index]
        local = sharded(input_ids=batch.chunk(world)[rank], labels=batch.chunk(world)[rank]).loss
        local.backward()
        optimizer.step()
        optimizer.zero_grad()
        expected = reference(input_ids=batch, labels=batch).loss
        expected.backward()
        reference_optimizer.step()
        reference_optimizer.zero_grad()
        mean = local.detach().clone()
        dist.all_reduce(mean)
        losses.append((float(mean) / world, float(expected)))
    return losses


def weight_difference(sharded, reference):
    full = gather_tied_model(sharded).state_dict()
    return max(float((full[name] - tensor).abs().max()) for name, tensor in reference.state_dict().items())


def setup(tying_map):
    torch.manual_seed(0)
    reference = TiedGPT2LMHeadModel(TiedGPT2Config(**SIZES, tying_map=tying_map))
    sharded = TiedGPT2LMHeadModel(TiedGPT2Config(**SIZES, tying_map=tying_map))
    sharded.load_state_dict(reference.state_dict())
    shard_tied_model(sharded, mesh=mesh)
    optimizer = torch.optim.AdamW(sharded.parameters(), lr=1e-3)
    return sharded, optimizer, reference, torch.optim.AdamW(reference.parameters(), lr=1e-3)


results = {"static": {}, "reties": []}
for tying_map in ([0, 0, 2, 2], [0, 1, 0, 1], [0, 0, 0, 0], [0, 1, 2, 3], [0, 1, 0, 0]):
    sharded, optimizer, reference, reference_optimizer = setup(tying_map)
    losses = train_steps(sharded, optimizer, reference, reference_optimizer, 0, 5)
    results["static"][str(tying_map)] = {"losses": losses, "weights": weight_difference(sharded, reference)}

# A sequence of re-ties: untie (a fresh copy), tie, a chain resolved to its root, untie everything.
sharded, optimizer, reference, reference_optimizer = setup([0, 0, 0, 0])
step = 0
for tying_map in ([0, 0, 0, 0], [0, 1, 1, 1], [0, 1, 1, 3], [0, 0, 2, 0], [0, 1, 2, 3]):
    if tying_map != [0, 0, 0, 0]:
        sharded = retie_sharded(sharded, optimizer, tying_map)
        sync_optimizer_with_model(reference_optimizer, reference, reference.retie(tying_map))
    losses = train_steps(sharded, optimizer, reference, reference_optimizer, step, 3)
    step += 3
    results["reties"].append(
        {"map": sharded.tying_map.to_list(), "losses": losses, "weights": weight_difference(sharded, reference)}
    )

try:
    sharded.retie([0, 0, 0, 0])
except RuntimeError as error:
    results["retie_error"] = str(error)
try:  # checked before any batch is scored
    evaluate_hop_task(sharded, [], batch_size=1)
except ValueError as error:
    results["evaluation_error"] = str(error)

# A half-precision model with a frozen embedding stays so through a re-tie and a gather.
torch.manual_seed(0)
half = TiedGPT2LMHeadModel(TiedGPT2Config(**SIZES, tying_map=[0, 0, 2, 2])).to(torch.bfloat16)
half.transformer.wte.requires_grad_(False)
half = retie_sharded(shard_tied_model(half, mesh=mesh), None, [0, 1, 2, 2])
half_gathered = gather_tied_model(half)
results["half"] = {
    "dtypes": sorted({str(parameter.dtype) for parameter in half_gathered.parameters()}),
    "frozen": [name for name, parameter in half_gathered.named_parameters() if not parameter.requires_grad],
}
del half, half_gathered

gathered = gather_tied_model(sharded)
if rank == 0:
    gathered.save_pretrained(f"{output_dir}/saved")
    ids = batches[0]
    with torch.no_grad():
        results["logits"] = reference.eval()(input_ids=ids).logits
        results["ids"] = ids
torch.save(results, f"{output_dir}/rank{rank}.pt")
del sharded, optimizer, reference, reference_optimizer, gathered
dist.destroy_process_group()
# Everything the test reads is written; gloo can still abort a finalizing interpreter (pytorch/pytorch#179291).
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
