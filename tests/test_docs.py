"""The documentation cannot rot: its tables are its records', its links resolve, its guides' commands run.

- Every generated table (`<!-- generated {...} -->`, bench/markdown_tables.py) equals what its results.json
  regenerates, and no hand-written Markdown types a study figure outside one.
- Every relative link and image in every Markdown file points at a file that exists, and at a heading that exists.
- Every block a guide in docs/ marks `<!-- runnable -->` runs, in order, in a fresh folder, as a user would. A block
  marked `<!-- runnable, needs MODULE -->` needs an optional package (llama-cpp-python, which builds for 20 minutes):
  without it the guide is skipped, saying so; CI installs it.
"""

import importlib.util
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `bench` is a folder of the repository, not installed
from bench.markdown_tables import BLOCK, REPO_ROOT, markdown_files, stale_blocks  # noqa: E402

MARKDOWN = markdown_files()
# Written by a run or a report, not by hand: the study's reports, example model cards, the card template.
GENERATED = ("bench/reports/", "model_cards/example_", "hf_layertie/templates/")
HAND_WRITTEN = [path for path in MARKDOWN if not path.relative_to(REPO_ROOT).as_posix().startswith(GENERATED)]
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
# A measured result: an estimate with its interval, or a value to three or more decimals (a loss, an accuracy).
STUDY_FIGURE = re.compile(r"\d\s*(?:±|\+/-)\s*\d|(?<![\d.])\d+\.\d{3,}(?![\d.])")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|<img [^>]*src=\"([^\"]+)\"")
RUNNABLE = re.compile(r"^<!-- runnable(?:, needs ([\w.]+))? -->\n```(bash|python)\n(.*?)^```", re.MULTILINE | re.DOTALL)
GUIDES = sorted((REPO_ROOT / "docs").glob("*.md"))


def _name(path: Path) -> str:
    return path.relative_to(REPO_ROOT).as_posix()


def test_markdown_files_are_found_and_the_guides_exist():
    assert REPO_ROOT / "README.md" in HAND_WRITTEN and REPO_ROOT / "bench" / "README.md" in HAND_WRITTEN
    assert any(RUNNABLE.search(guide.read_text()) for guide in GUIDES)


@pytest.mark.parametrize("path", [path for path in MARKDOWN if BLOCK.search(path.read_text())], ids=_name)
def test_every_generated_table_is_what_its_records_regenerate(path):
    assert stale_blocks(path) == [], f"run `python bench/markdown_tables.py`: {_name(path)} has stale tables"


@pytest.mark.parametrize("path", HAND_WRITTEN, ids=_name)
def test_no_study_figure_is_typed_by_hand(path):
    prose = FENCE.sub("", BLOCK.sub("", path.read_text()))
    typed = [match.group(0) for match in STUDY_FIGURE.finditer(prose)]
    assert typed == [], f"{_name(path)}: figures typed outside a generated table: {typed[:10]}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|<[^>]+>", lambda match: "_" if match.group(0) == "_" else "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", path.read_text()), re.MULTILINE):
        slug = _slug(heading)
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


@pytest.mark.parametrize("path", MARKDOWN, ids=_name)
def test_every_relative_link_resolves(path):
    broken = []
    for match in LINK.finditer(FENCE.sub("", path.read_text())):
        target = match.group(1) or match.group(2)
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target} (no heading #{anchor})")
    assert broken == [], f"{_name(path)}: {broken}"


RUNNABLE_GUIDES = [guide for guide in GUIDES if RUNNABLE.search(guide.read_text())]


# A guard against a hung block, not a speed target: a block takes under a minute on an idle machine, and several
# times that when the suite's other processes share its 2 cores (the serving guide's download and conversion did).
BLOCK_TIMEOUT = 900


def _run_guide(guide: Path, folder: Path) -> str | None:
    """Run the guide's runnable blocks in order in `folder`, as a user would; the first failure's text, or None."""
    for script in ("run_clm.py", "run_mlm.py", "run_lambada.py", "bench"):
        (folder / script).symlink_to(REPO_ROOT / script)
    # `python` in a block is the interpreter running the tests (CI's oldest-versions pass runs an unactivated venv).
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    # One thread per process, as the other multi-process tests run: tiny models on a shared CPU run faster so.
    environment = os.environ | {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT), "PATH": path, "OMP_NUM_THREADS": "1"}
    for number, (_, language, code) in enumerate(RUNNABLE.findall(guide.read_text()), start=1):
        command = ["bash", "-euo", "pipefail", "-c", code] if language == "bash" else [sys.executable, "-c", code]
        try:
            done = subprocess.run(command, cwd=folder, env=environment, capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired as timed_out:
            output = f"{timed_out.stdout or ''}\n{timed_out.stderr or ''}"
            return f"{_name(guide)}, runnable block {number}: still running after {BLOCK_TIMEOUT} s\n{code}\n{output[-6000:]}"
        if done.returncode != 0:
            return f"{_name(guide)}, runnable block {number}:\n{code}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return None


@pytest.fixture(scope="module")
def guide_failures(tmp_path_factory) -> dict[Path, str | None]:
    """Every guide run, two at a time: the guides' blocks are mostly interpreter start-up, so a second one overlaps."""
    runnable = [guide for guide in RUNNABLE_GUIDES if not _missing_modules(guide)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = {guide: pool.submit(_run_guide, guide, tmp_path_factory.mktemp(guide.stem)) for guide in runnable}
    return {guide: run.result() for guide, run in runs.items()}


@pytest.mark.e2e
@pytest.mark.parametrize("guide", RUNNABLE_GUIDES, ids=_name)
def test_every_runnable_block_of_a_guide_runs(guide, guide_failures):
    missing = _missing_modules(guide)
    if missing:
        pytest.skip(f"{_name(guide)} needs {', '.join(missing)}, not installed here (CI installs it)")
    assert guide_failures[guide] is None, guide_failures[guide]


def _missing_modules(guide: Path) -> list[str]:
    """The optional modules a guide's runnable blocks need (`<!-- runnable, needs MODULE -->`) that are not installed."""
    needed = {module for module, _, _ in RUNNABLE.findall(guide.read_text()) if module}
    return sorted(module for module in needed if importlib.util.find_spec(module) is None)
