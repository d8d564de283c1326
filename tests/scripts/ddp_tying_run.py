"""Train a tiny tied model with re-ties under several processes; each rank dumps its final map and weights.

Launched by tests/trainer/test_distributed.py exactly as the README tells users to launch:
`ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 tests/scripts/ddp_tying_run.py OUTPUT_DIR MODEL
[LOOP_LR_EXPONENT]`, where MODEL is a key of `launched.SIZES` (default gpt2); with LOOP_LR_EXPONENT each rank also
records whether every block Parameter ended in the param group of its use count.
"""

import sys

import torch
from launched import random_tying_trainer, run_then_exit

from hf_layertie.engine.block_learning_rates import BLOCK_USES, block_uses


def main():
    output_dir = sys.argv[1]
    model_name = sys.argv[2] if len(sys.argv) > 2 else "gpt2"
    settings = {"loop_lr_exponent": float(sys.argv[3])} if len(sys.argv) > 3 else {}
    trainer = random_tying_trainer(output_dir, max_steps=24, rows=128, model_name=model_name, **settings)
    model = trainer.model
    trainer.train()
    rank = trainer.args.process_index
    torch.save(
        {
            "world_size": trainer.args.world_size,
            "map": model.tying_map.to_list(),
            "maps": [record["map"] for record in trainer.tying_records],
            "state_dict": {name: tensor.clone() for name, tensor in model.state_dict().items()},
            "group_uses": [
                (group.get(BLOCK_USES), sorted(block_uses(model).get(parameter, 1) for parameter in group["params"]))
                for group in trainer.optimizer.optimizer.param_groups
            ],
        },
        f"{output_dir}/rank{rank}.pt",
    )


if __name__ == "__main__":
    run_then_exit(main)
