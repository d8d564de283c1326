"""Two ranks, the main process's agent raising in its second decision (`decide`) or in the last outcome (`finish`):
the other rank must stop with it.

Started by tests/trainer/test_tying_trainer.py as two bare torch.distributed processes (no launcher that would end the other
rank once one fails): `ddp_decision_failure_run.py OUTPUT_DIR decide|finish`. Each rank writes the error it stopped
with to OUTPUT_DIR/stopped<rank>.txt. Without the failure being shared, rank 1 waits in the next collective: for ever
while the main process lives on, and here, where it exits, until gloo's opaque "Connection closed by peer".
"""

import sys

from launched import random_tying_trainer, run_then_exit


def main():
    output_dir, failing = sys.argv[1], sys.argv[2]
    trainer = random_tying_trainer(output_dir, max_steps=8, rows=64, ddp_timeout=60)
    # The agent's part, which runs on the main process alone, after the processes' collectives (its `decide` gives
    # the pending decision its outcome through its `finish` too: the run's last outcome is the one at step 8).
    controller = trainer.decisions.controller
    original = getattr(controller, failing)
    calls = 0

    def failing_on_the_main_process(*args):
        nonlocal calls
        calls += 1
        if (failing, calls) == ("decide", 2) or (failing, trainer.state.global_step) == ("finish", 8):
            raise ValueError(f"the agent failed in {failing}")
        return original(*args)

    setattr(controller, failing, failing_on_the_main_process)
    try:
        trainer.train()
    except (ValueError, RuntimeError) as error:
        with open(f"{output_dir}/stopped{trainer.args.process_index}.txt", "w") as stopped:
            stopped.write(f"{type(error).__name__}: {error}")


if __name__ == "__main__":
    run_then_exit(main)
