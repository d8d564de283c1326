"""A DDP wrapper's communication hook, own hooks and settings survive the re-ties of a 2-rank run; unsurvivable ones
are refused before the first step. Each rank dumps what it saw.

Launched by tests/trainer/test_distributed.py:
`ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 tests/scripts/ddp_comm_hook_run.py OUTPUT_DIR`.
"""

import sys

import torch
from launched import random_tying_trainer, run_then_exit
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from transformers import TrainerCallback


class CountingState:
    """The state of `counting_hook`: the steps at which it ran (one entry per gradient bucket)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.steps = []


def counting_hook(state, bucket):
    state.steps.append(state.trainer.state.global_step)
    return default_hooks.allreduce_hook(None, bucket)


def settings(wrapper):
    """What the wrapper was built with (as its constructor stores it), its comm hook's name and its mode."""
    names = (
        "device_ids", "output_device", "dim", "forward_sync_buffers", "find_unused_parameters", "gradient_as_bucket_view",
        "static_graph", "skip_all_reduce_unused_params", "batched_grad_copy", "mixed_precision", "_bucket_config",
        "bucket_bytes_cap_list", "bucket_bytes_cap_default", "process_group", "training",
    )  # fmt: skip
    return {
        **{name: repr(getattr(wrapper, name, None)) for name in names},
        "comm_hook": wrapper._get_ddp_logging_data().get("comm_hook"),
    }


class HookTheWrapper(TrainerCallback):
    """On the DDP wrapper the Trainer built: a counting comm hook and a counting forward pre-hook; the wrapper's
    settings are recorded at the start and at the end of training."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.state = CountingState(trainer)
        self.forward_steps = []

    def on_train_begin(self, args, state, control, **kwargs):
        wrapper = self.trainer.model_wrapped
        assert isinstance(wrapper, torch.nn.parallel.DistributedDataParallel), type(wrapper)
        wrapper.register_comm_hook(self.state, counting_hook)
        wrapper.register_forward_pre_hook(lambda module, inputs: self.forward_steps.append(self.trainer.state.global_step))
        self.settings_begin = settings(wrapper)

    def on_train_end(self, args, state, control, **kwargs):
        self.settings_end = settings(self.trainer.model_wrapped)


class PowerSGD(TrainerCallback):
    def __init__(self, trainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer.model_wrapped.register_comm_hook(powerSGD_hook.PowerSGDState(None), powerSGD_hook.powerSGD_hook)


def main():
    output_dir = sys.argv[1]
    trainer = random_tying_trainer(output_dir, max_steps=12, rows=64)
    hooked = HookTheWrapper(trainer)
    trainer.add_callback(hooked)
    trainer.train()
    model = trainer.model

    refused = random_tying_trainer(output_dir, max_steps=4, rows=64)
    refused.add_callback(PowerSGD(refused))
    try:
        refused.train()
        refusal = None
    except ValueError as error:
        refusal = (str(error), refused.state.global_step)

    # A fixed map with relaxed ties never rebuilds the wrapper: PowerSGD is allowed there.
    static = random_tying_trainer(
        output_dir, max_steps=4, rows=64, tying_strategy="static:0,0,2,2", lora_rank=1,
        tying_initial_map=None, tying_interval=None, agent_seed=None,
    )  # fmt: skip
    static.add_callback(PowerSGD(static))
    static.train()

    torch.save(
        {
            "world_size": trainer.args.world_size,
            "static_steps": static.state.global_step,
            "maps": [(record["step"], record["map"]) for record in trainer.tying_records],
            "hook_steps": hooked.state.steps,
            "forward_steps": hooked.forward_steps,
            "settings_begin": hooked.settings_begin,
            "settings_end": hooked.settings_end,
            "state_dict": {name: tensor.clone() for name, tensor in model.state_dict().items()},
            "refusal": refusal,
        },
        f"{output_dir}/rank{trainer.args.process_index}.pt",
    )


if __name__ == "__main__":
    run_then_exit(main)
