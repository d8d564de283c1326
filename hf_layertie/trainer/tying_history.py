"""`tying_history.jsonl`: one strict-JSON line per completed tying decision, written as the run goes."""

from __future__ import annotations

import json
import os

TYING_HISTORY_NAME = "tying_history.jsonl"


class TyingHistory:
    """Queues completed decision rows and appends them to `output_dir/tying_history.jsonl` at each checkpoint and at
    the end of training. The first write of a run (fresh, or resumed from a checkpoint whose rows it rewrites)
    starts a new file, so the file always matches the run it sits beside."""

    def __init__(self, output_dir: str):
        self.path = os.path.join(output_dir, TYING_HISTORY_NAME)
        self._unwritten: list[dict] = []
        self._started = False

    def add(self, row: dict) -> None:
        self._unwritten.append(row)

    def restart(self, rows: list[dict]) -> None:
        """The run goes on from a checkpoint holding `rows`: the file is rewritten from them at the next flush."""
        self._unwritten = list(rows)
        self._started = False

    def flush(self, should_save: bool) -> None:
        """Write the queued rows (only the process that saves writes; the others drop theirs)."""
        rows, self._unwritten = self._unwritten, []
        if not rows or not should_save:
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "a" if self._started else "w") as history:
            history.writelines(json.dumps(row, allow_nan=False) + "\n" for row in rows)
        self._started = True
