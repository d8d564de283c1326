"""`TyingHistory`: the run's tying decisions, and `tying_history.jsonl`, one strict-JSON line per completed one."""

from __future__ import annotations

import dataclasses
import json
import os

from ..decisions import Decision
from ..dlt import Outcome

TYING_HISTORY_NAME = "tying_history.jsonl"


class TyingHistory:
    """Every decision of the run in order (the last may still await its outcome), kept by the trainer alone.

    Completed decisions are queued as rows and appended to `output_dir/tying_history.jsonl` at each checkpoint and
    at the end of training. The first write of a run (fresh, or resumed from a checkpoint whose rows it rewrites)
    starts a new file, so the file always matches the run it sits beside.
    """

    def __init__(self, output_dir: str):
        self.path = os.path.join(output_dir, TYING_HISTORY_NAME)
        self.decisions: list[Decision] = []
        self._unwritten: list[dict] = []
        self._started = False

    @property
    def current(self) -> Decision | None:
        """The last decision taken (None before the first)."""
        return self.decisions[-1] if self.decisions else None

    @property
    def pending(self) -> Decision | None:
        """The last decision, while it awaits its outcome."""
        current = self.current
        return current if current is not None and not current.completed else None

    @property
    def rows(self) -> list[dict]:
        """Every decision's row, the one in force included: which map held from which step."""
        return [decision.to_row() for decision in self.decisions]

    def record(self, decision: Decision) -> None:
        """Add the decision just applied; queue its row if it is complete."""
        self.decisions.append(decision)
        if decision.completed:
            self._unwritten.append(decision.to_row())

    def complete(self, outcome: Outcome) -> Decision:
        """Give the pending decision its `outcome`; queue and return the completed decision."""
        if self.pending is None:
            raise ValueError("no decision awaits an outcome")
        completed = dataclasses.replace(self.decisions[-1], outcome=outcome)
        self.decisions[-1] = completed
        self._unwritten.append(completed.to_row())
        return completed

    def state_dict(self) -> dict:
        """The completed rows and the pending one (None when none), as `tying_state.pt` has always held them."""
        pending = self.pending
        completed = self.decisions[:-1] if pending is not None else self.decisions
        return {"rows": [decision.to_row() for decision in completed], "pending_row": None if pending is None else pending.to_row()}

    def load_state_dict(self, state: dict) -> None:
        """The run goes on from a checkpoint: its decisions replace these, and the file is rewritten from its
        completed rows at the next flush."""
        self.decisions = [Decision.from_row(row) for row in state["rows"]]
        if state["pending_row"] is not None:
            self.decisions.append(Decision.from_row(state["pending_row"], pending=True))
        self._unwritten = list(state["rows"])
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
