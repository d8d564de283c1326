"""The committed study reports are what their committed records give: each is rewritten from `bench/results/` by
its own command (`--report_only true`, into a temporary folder) and compared with the report the README and
bench/README read (their tables are checked against these reports by tests/test_docs.py). A record edited, added or
lost, or report code changed without its reports regenerated, fails here. A report written elsewhere than
`bench/reports/` leaves the Markdown tables alone, so the check changes nothing in the checkout."""

import json
import re
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # `bench` is a folder of the repository, not part of the installed package

from bench import compress, run_bench  # noqa: E402

SCRIPTS = {"run_bench.py": run_bench.main, "compress.py": compress.main}

# (script, preset, committed report folder). The reports left out were written by the report code of an earlier
# commit, from folders the current presets no longer accept (`gpu768`, `paper-2000-steps`, `memory512`, the GPU
# reports), or by scripts of their own (recipe, compile, sharding): bench/README.md, "Provenance", names each.
REBUILT = [
    ("run_bench.py", "default", "study/default"),
    ("run_bench.py", "paper", "study/paper"),
    ("run_bench.py", "paper48", "study/paper48"),
    ("run_bench.py", "depth", "study/depth"),
    ("run_bench.py", "depth-fresh", "study/depth-fresh"),
    ("run_bench.py", "partial-depth", "study/partial-depth"),
    ("compress.py", "default", "compress"),
    ("compress.py", "depth", "compress/depth"),
]
# The machine that wrote the report, named where records predate recording theirs: not something records give.
WRITER_DEPENDENT = {"hardware"}
HARDWARE_SENTENCE = re.compile(r"Hardware: [^\n]*")


def _comparable(folder: Path) -> tuple[str, str]:
    """results.json without the writer's machine, and results.md without its hardware sentence."""
    report = json.loads((folder / "results.json").read_text())
    contents = {key: value for key, value in report.items() if key not in WRITER_DEPENDENT}
    text = HARDWARE_SENTENCE.sub("Hardware: ...", (folder / "results.md").read_text())
    return json.dumps(contents, indent=1, sort_keys=True), text  # NaN (a one-seed interval) compares equal as text


@pytest.mark.slow
@pytest.mark.parametrize(("script", "preset", "committed"), REBUILT, ids=[committed for _, _, committed in REBUILT])
def test_a_committed_report_is_what_its_committed_records_give(tmp_path, monkeypatch, script, preset, committed):
    command = [f"bench/{script}", "--preset", preset, "--report_only", "true", "--report_dir", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", command)  # the script's own entry point, in this process (no interpreter start)
    SCRIPTS[script]()
    (rebuilt, rebuilt_text), (saved, saved_text) = _comparable(tmp_path), _comparable(REPO_ROOT / "bench" / "reports" / committed)
    regenerate = f"bench/reports/{committed} differs from what `python {' '.join(command[:-2])}` writes: regenerate it"
    assert rebuilt == saved, regenerate
    assert rebuilt_text == saved_text, regenerate
