"""How every multi-process test script ends (imported by its siblings, which run with this folder on sys.path)."""

import os
import sys

from hf_layertie.toolkit import process_group_ended


def run_then_exit(main) -> None:
    """Run `main` inside `process_group_ended()` (the group is destroyed after main's objects are freed), then leave.

    Everything the test reads is written by then. gloo can still abort an interpreter that finalizes after its work
    (SIGABRT, "terminate called without an active exception"; pytorch/pytorch#179291): leave without finalizing.
    """
    with process_group_ended():
        main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
