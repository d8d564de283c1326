"""Distil into the tiny re-tying run on two processes to the end, then again resumed from its checkpoint of step 4;
each rank dumps both runs' final weights and its teacher's.

Launched by tests/trainer/test_distillation.py (`accelerate launch --multi_gpu --num_processes 2 ... OUTPUT_DIR TEACHER_DIR`).
"""

import sys

import torch
from launched import random_tying_trainer, run_then_exit


def main():
    output_dir, teacher_dir = sys.argv[1], sys.argv[2]
    settings = dict(distill_from=teacher_dir, save_strategy="steps", save_steps=4, lr_scheduler_type="constant", seed=0)
    full = random_tying_trainer(f"{output_dir}/full", max_steps=8, rows=128, **settings)
    full.train()
    resumed = random_tying_trainer(f"{output_dir}/resumed", max_steps=8, rows=128, **settings)
    resumed.train(resume_from_checkpoint=f"{output_dir}/full/checkpoint-4")

    def weights(model):
        return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}

    torch.save(
        {
            "world_size": full.args.world_size,
            "full": weights(full.model),
            "resumed": weights(resumed.model),
            "teacher": weights(resumed.distillation.teacher),
        },
        f"{output_dir}/rank{full.args.process_index}.pt",
    )


if __name__ == "__main__":
    run_then_exit(main)
