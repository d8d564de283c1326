"""The committed study reports are what their committed records give: each is rewritten from `bench/results/` by
its own command (from the records alone, into a temporary folder) and compared with the report the README and
bench/README read (their tables are checked against these reports by tests/test_docs.py). A record edited, added or
lost, or report code changed without its reports regenerated, fails here. A report written elsewhere than
`bench/reports/` leaves the Markdown tables alone, so the check changes nothing in the checkout."""

import json
import re
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # `bench` is a folder of the repository, not part of the installed package

from bench import (  # noqa: E402
    compress,
    hop_depth,
    loop_choice,
    loop_compute,
    loop_depth,
    recipe_report,
    rerun_check,
    run_bench,
    serving,
)

# The fast tier (`python -m pytest -m "not e2e and not slow"`) leaves these out: the committed reports rebuilt from their records.
pytestmark = pytest.mark.e2e

SCRIPTS = {"run_bench.py": run_bench.main, "compress.py": compress.main, "hop_depth.py": hop_depth.main,
           "recipe_report.py": recipe_report.main, "serving.py": serving.main, "loop_choice.py": loop_choice.main,
           "loop_compute.py": loop_compute.main, "loop_depth.py": loop_depth.main, "rerun_check.py": rerun_check.main}  # fmt: skip

# (the command that writes it, less --report_dir; its committed folder; the report's name there). The reports left
# out were written by the report code of an earlier commit, from folders the current presets no longer accept
# (`gpu768`, `paper-2000-steps`, `memory512`, the GPU reports), or measure as they write (compile, sharding):
# bench/README.md, "Provenance", names each.
REBUILT = [
    (["run_bench.py", "--preset", "default", "--report_only", "true"], "study/default", "results"),
    (["run_bench.py", "--preset", "paper", "--report_only", "true"], "study/paper", "results"),
    (["run_bench.py", "--preset", "paper48", "--report_only", "true"], "study/paper48", "results"),
    (["run_bench.py", "--preset", "depth", "--report_only", "true"], "study/depth", "results"),
    (["run_bench.py", "--preset", "depth-fresh", "--report_only", "true"], "study/depth-fresh", "results"),
    (["run_bench.py", "--preset", "partial", "--report_only", "true"], "study/partial", "results"),
    (["run_bench.py", "--preset", "partial-depth", "--report_only", "true"], "study/partial-depth", "results"),
    (["compress.py", "--preset", "default", "--report_only", "true"], "compress", "results"),
    (["compress.py", "--preset", "depth", "--report_only", "true"], "compress/depth", "results"),
    (["hop_depth.py", "--report_only"], "study/depth", "hop_induction"),
    (["recipe_report.py"], "study/recipe", "results"),
    (["serving.py", "--report_only"], "serving", "results"),
    (["loop_choice.py"], "study/loops", "choice"),
    (["run_bench.py", "--preset", "loops-language", "--report_only", "true"], "study/loops-language", "results"),
    (["run_bench.py", "--preset", "loops-hop", "--report_only", "true"], "study/loops-hop", "results"),
    (["run_bench.py", "--preset", "loops-language-gpu", "--report_only", "true"], "study/loops-language-gpu", "results"),
    (["loop_compute.py"], "study/loops", "compute-language"),
    (["loop_depth.py", "--task", "language", "--report_only", "true"], "study/loops", "inference-depth-language"),
    (["loop_depth.py", "--task", "hop", "--report_only", "true"], "study/loops", "inference-depth-hop"),
    (["rerun_check.py", "--preset", "loops-language", "--rows", "0 1 2 1 2 5 + recipe", "--rerun", str(REPO_ROOT / "bench" / "results" / "loops-language-hardware")], "study/loops-language", "rerun"),
    (["rerun_check.py", "--preset", "loops-hop", "--rows", "untied, 2 blocks|untied, 4 blocks|0 1 1 1|cycle:2, 4 positions|0 1 1 1 + recipe|cycle:2, 4 positions + recipe", "--rerun", str(REPO_ROOT / "bench" / "results" / "loops-hop-clean")], "study/loops-hop", "rerun"),
]
# The machine that wrote the report, named where records predate recording theirs: not something records give.
WRITER_DEPENDENT = {"hardware"}
HARDWARE_SENTENCE = re.compile(r"Hardware: [^\n]*")


def _comparable(folder: Path, name: str) -> tuple[str, str]:
    """The report's JSON without the writer's machine, and its Markdown without its hardware sentence."""
    report = json.loads((folder / f"{name}.json").read_text())
    contents = {key: value for key, value in report.items() if key not in WRITER_DEPENDENT}
    text = HARDWARE_SENTENCE.sub("Hardware: ...", (folder / f"{name}.md").read_text())
    return json.dumps(contents, indent=1, sort_keys=True), text  # NaN (a one-seed interval) compares equal as text


@pytest.mark.slow
@pytest.mark.parametrize(("command", "committed", "name"), REBUILT, ids=[f"{folder}/{name}" for _, folder, name in REBUILT])
def test_a_committed_report_is_what_its_committed_records_give(tmp_path, monkeypatch, command, committed, name):
    script, *flags = command
    argv = [f"bench/{script}", *flags, "--report_dir", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)  # the script's own entry point, in this process (no interpreter start)
    SCRIPTS[script]()
    rebuilt, saved = _comparable(tmp_path, name), _comparable(REPO_ROOT / "bench" / "reports" / committed, name)
    regenerate = f"bench/reports/{committed}/{name} differs from what `python {' '.join(argv[:-2])}` writes: regenerate it"
    assert rebuilt[0] == saved[0], regenerate
    assert rebuilt[1] == saved[1], regenerate


def test_the_embedded_default_s_report_is_what_its_records_give(tmp_path):
    """bench/embedded_default.py's report, which the README and the quickstart cite, from its committed records."""
    from bench import embedded_default

    embedded_default.write_report(report_dir=tmp_path)
    assert _comparable(tmp_path, "results") == _comparable(embedded_default.REPORT, "results")
