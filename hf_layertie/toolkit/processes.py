"""How every script ends: the process group it joined is destroyed, whichever way the run ended."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from accelerate import PartialState


@contextmanager
def process_group_ended() -> Iterator[None]:
    """Destroy the process group on leaving the block, however it is left (a finished run re-run included).

    Parsing `TrainingArguments` joins the group under `accelerate launch` or `torchrun`; gloo aborts the
    interpreter at exit (SIGABRT) after a run that finished unless the group is destroyed.
    """
    try:
        yield
    finally:
        PartialState().destroy_process_group()
