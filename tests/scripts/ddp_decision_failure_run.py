"""Two ranks, the main process's agent raising in its second decision: the other rank must stop with it.

Started by tests/test_tying_trainer.py as two bare torch.distributed processes (no launcher that would end the other
rank once one fails). Each rank writes the error it stopped with to OUTPUT_DIR/stopped<rank>.txt. Without the failure
being sent, rank 1 waits in the decision's broadcast: for ever while the main process lives on, and here, where it
exits, until gloo's opaque "Connection closed by peer"."""

import sys

from launched import random_tying_trainer, run_then_exit


def main():
    output_dir = sys.argv[1]
    trainer = random_tying_trainer(output_dir, max_steps=8, rows=64, ddp_timeout=60)
    # The agent's part of a decision, which runs on the main process alone after the processes' collectives.
    controller = trainer.decisions.controller
    decide = controller.decide
    calls = 0

    def failing_in_the_second_decision(*args):
        nonlocal calls
        calls += 1
        if calls == 2:
            raise ValueError("the strategy failed here")
        return decide(*args)

    controller.decide = failing_in_the_second_decision
    try:
        trainer.train()
    except (ValueError, RuntimeError) as error:
        with open(f"{output_dir}/stopped{trainer.args.process_index}.txt", "w") as stopped:
            stopped.write(f"{type(error).__name__}: {error}")


if __name__ == "__main__":
    run_then_exit(main)
