"""Two ranks, a NaN loss on rank 1 only, in step 3: every rank must stop there with the same error.

Launched by tests/trainer/test_tying_trainer.py like tests/scripts/ddp_tying_run.py. Each rank writes the error it stopped
with to OUTPUT_DIR/stopped<rank>.txt; a rank that did not stop would wait for the other in the next collective until
`ddp_timeout` and fail the launch.
"""

import sys

import datasets
import torch
from launched import run_then_exit

from hf_layertie import TiedGPT2Config, TiedGPT2LMHeadModel, TyingTrainer, TyingTrainingArguments


def main():
    output_dir = sys.argv[1]
    torch.manual_seed(0)
    model = TiedGPT2LMHeadModel(TiedGPT2Config(n_layer=4, n_embd=32, n_head=2, n_positions=32, vocab_size=100))
    ids = torch.randint(0, 100, (128, 16), generator=torch.Generator().manual_seed(1)).tolist()
    data = datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})
    args = TyingTrainingArguments(
        output_dir=output_dir,
        tying_interval=4,
        max_steps=4,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        use_cpu=True,
        report_to=[],
        save_strategy="steps",
        save_steps=1,
        disable_tqdm=True,
        ddp_timeout=60,
    )
    trainer = TyingTrainer(model=model, args=args, train_dataset=data)
    forward_passes = 0


    def nan_on_rank_1_in_step_3(module, inputs, output):
        nonlocal forward_passes
        forward_passes += 1
        return output * float("nan") if trainer.args.process_index == 1 and forward_passes == 3 else output


    model.lm_head.register_forward_hook(nan_on_rank_1_in_step_3)
    try:
        trainer.train()
    except FloatingPointError as error:
        with open(f"{output_dir}/stopped{trainer.args.process_index}.txt", "w") as stopped:
            stopped.write(str(error))


if __name__ == "__main__":
    run_then_exit(main)
