"""Train DLT on two processes to the end, then again resumed from a checkpoint taken inside a decision's window;
each rank dumps both runs' decisions and final weights.

Launched by tests/trainer/test_distributed.py (`accelerate launch --multi_gpu --num_processes 2 ... OUTPUT_DIR`). The ranks
see different batches, so each holds its own part of the open window's loss when the checkpoint is written.
"""

import sys

import datasets
import torch
from launched import run_then_exit

from hf_layertie import TiedGPT2Config, TiedGPT2LMHeadModel, TyingTrainer, TyingTrainingArguments


def main():
    output_dir = sys.argv[1]
    ids = torch.randint(0, 100, (256, 16), generator=torch.Generator().manual_seed(1)).tolist()
    data = datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})


    def train(folder, resume_from_checkpoint=None):
        torch.manual_seed(0)
        model = TiedGPT2LMHeadModel(TiedGPT2Config(n_layer=4, n_embd=32, n_head=2, n_positions=32, vocab_size=100))
        args = TyingTrainingArguments(
            output_dir=folder,
            tying_strategy="dlt",
            tying_interval=4,
            max_steps=12,
            save_strategy="steps",
            save_steps=6,  # mid-window: the decision of step 4 waits for steps 4-7
            per_device_train_batch_size=4,
            learning_rate=1e-3,
            lr_scheduler_type="constant",
            use_cpu=True,
            report_to=[],
            disable_tqdm=True,
            seed=0,
        )
        trainer = TyingTrainer(model=model, args=args, train_dataset=data)
        trainer.train(resume_from_checkpoint=resume_from_checkpoint)
        return trainer


    full = train(f"{output_dir}/full")
    resumed = train(f"{output_dir}/resumed", resume_from_checkpoint=f"{output_dir}/full/checkpoint-6")
    rank = full.args.process_index
    torch.save(
        {
            name: {
                "records": trainer.tying_records,
                "state_dict": {key: tensor.clone() for key, tensor in trainer.model.state_dict().items()},
            }
            for name, trainer in (("full", full), ("resumed", resumed))
        },
        f"{output_dir}/rank{rank}.pt",
    )


if __name__ == "__main__":
    run_then_exit(main)
