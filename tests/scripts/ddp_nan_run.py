"""Two ranks, a NaN loss on rank 1 only, in step 3: every rank must stop there with the same error.

Launched by tests/trainer/test_tying_trainer.py like tests/scripts/ddp_tying_run.py. Each rank writes the error it stopped
with to OUTPUT_DIR/stopped<rank>.txt; a rank that did not stop would wait for the other in the next collective until
`ddp_timeout` and fail the launch.
"""

import sys

from launched import random_tying_trainer, run_then_exit


def main():
    output_dir = sys.argv[1]
    # The first decision would come at step 4: the NaN in step 3 meets the maps as they started, on every rank.
    trainer = random_tying_trainer(
        output_dir, max_steps=4, rows=128, tying_interval=4, save_strategy="steps", save_steps=1, ddp_timeout=60
    )
    forward_passes = 0

    def nan_on_rank_1_in_step_3(module, inputs, output):
        nonlocal forward_passes
        forward_passes += 1
        return output * float("nan") if trainer.args.process_index == 1 and forward_passes == 3 else output

    trainer.model.lm_head.register_forward_hook(nan_on_rank_1_in_step_3)
    try:
        trainer.train()
    except FloatingPointError as error:
        with open(f"{output_dir}/stopped{trainer.args.process_index}.txt", "w") as stopped:
            stopped.write(str(error))


if __name__ == "__main__":
    run_then_exit(main)
