"""Processes: how every script ends (the process group it joined is destroyed, whichever way the run ended), and
what the evaluations shared out between processes need."""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from accelerate import PartialState
from torch import nn

from ..models._compat import is_fsdp_sharded


@contextmanager
def process_group_ended() -> Iterator[None]:
    """Destroy the process group on leaving the block, however it is left (a finished run re-run included).

    Parsing `TrainingArguments` joins the group under `accelerate launch` or `torchrun`; gloo aborts the
    interpreter at exit (SIGABRT, "terminate called without an active exception") after a run that finished unless
    the group is destroyed, and destroyed after the objects of the run (trainer, model, DDP wrapper): tensors that
    gloo's pending work still references must not be freed while the interpreter shuts down. So do the run's work in
    a function called inside this block, and leave nothing of it in globals; reference cycles are collected here.
    """
    try:
        yield
    finally:
        gc.collect()
        PartialState().destroy_process_group()


def this_process_share(model: nn.Module, items: Sequence, function: str) -> Sequence:
    """The `items` (batches) this process scores in an evaluation shared out between processes: every
    num_processes-th, from its rank on, so that long and short batches spread alike; all of them on one process.
    An FSDP2-sharded model is refused: its forward is collective, and processes running different numbers of
    forwards would wait on each other for ever."""
    if is_fsdp_sharded(model):
        raise ValueError(
            f"{function} scores an unsharded model (each process scores its own batches); pass "
            "hf_layertie.gather_tied_model(model) instead of the FSDP2-sharded one"
        )
    state = PartialState()
    return items[state.process_index :: state.num_processes]
