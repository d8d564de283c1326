"""Tables in hand-written Markdown, generated from the records they report, never typed.

A table sits between two HTML comments, which GitHub and the Hub do not render:

    <!-- generated {"source": "bench/reports/study/default/results.json", "rows": ["none", "dlt"],
                    "columns": [{"header": "test loss", "value": "test_loss", "format": "estimate"}]} -->
    ...the table, written by this module...
    <!-- end generated -->

(the JSON on one line). `python bench/markdown_tables.py` rewrites every such block in the repository's Markdown
from its source; `--check` changes nothing and fails naming each block that differs, as tests/test_docs.py does.
So a number in the README or a guide is the one its results.json holds, and a regenerated report updates them.

The JSON of a block:
- `source`: a results.json, relative to the repository root; its `rows` mapping (or `rows_key`'s) holds the rows.
- `rows`: each a row label, or an object `{"row": label, "source": ..., "rows_key": ..., "name": shown name,
  <text keys>}` for a row from another file or with text cells. Where `rows_key` holds a list of records (a
  report's `memory` runs), the row object's `where` picks the one record whose fields have those values, e.g.
  `{"row": "dlt, 48 blocks", "rows_key": "memory", "where": {"strategy": "dlt", "num_blocks": 48}}`.
- `columns`: each `{"header": h, "value": "dotted.path", "format": f}` (a value of the row's record; `{key}` in
  the path is the row object's text, e.g. `"{versus}"`) or `{"header": h, "text": key}` (the row object's text).
  The first column is the row's name, titled `first`.
- `format`: `estimate` (a value with its `<path>_half_width` sibling, or a `[mean, half_width]` pair),
  `difference` (a paired `{mean, half_width}`; with `left_out` seeds it could not pair, says so), `verdict` (the
  same with its verdict), `seeds` (a list's length), `pairs` (a mapping, as `key: value; ...`),
  or a Python format spec (`.1f`); default `str`.
- `unit`: `MiB` on a column whose values are bytes: each is divided by 2**20 before `format`.
- `{"table": "settings"}` instead: every setting `TyingTrainingArguments` adds to transformers' own, with the
  strategies that read it and its default (from the strategy registry, as `--help` says).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from bench.scheduling import write_whole  # noqa: E402

MIB = 2**20
UNITS = {"MiB": MIB}  # a column's `unit`: what its values, in bytes, are divided by
BLOCK = re.compile(r"^<!-- generated (\{[^\n]*\}) -->\n(.*?)^<!-- end generated -->$", re.MULTILINE | re.DOTALL)
# Folders whose Markdown is not the repository's own: run outputs, caches, the records of the study.
SKIPPED_FOLDERS = {".git", "outputs", "bench/results", "build", "dist", ".pytest_cache"}


def markdown_files(root: Path = REPO_ROOT) -> list[Path]:
    """Every Markdown file of the repository (not under run outputs, records or build folders)."""
    def skipped(path: Path) -> bool:
        relative = path.relative_to(root).as_posix()
        return any(relative == folder or relative.startswith(folder + "/") for folder in SKIPPED_FOLDERS) or any(
            part.endswith(".egg-info") for part in path.relative_to(root).parts
        )

    return sorted(path for path in root.rglob("*.md") if not skipped(path))


def render(spec: dict, root: Path = REPO_ROOT) -> str:
    """The Markdown table a block's JSON asks for, ending with a newline."""
    if spec.get("table") == "settings":
        return _settings_table()
    columns = spec["columns"]
    lines = ["| " + " | ".join([spec.get("first", "")] + [column["header"] for column in columns]) + " |"]
    lines.append("|" + "---|" * (len(columns) + 1))
    for row in spec["rows"]:
        row = {"row": row} if isinstance(row, str) else row
        record = _record(row, spec, root)
        cells = [row.get("name", row["row"])] + [_cell(column, row, record) for column in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _record(row: dict, spec: dict, root: Path) -> dict:
    source = row.get("source", spec.get("source"))
    if source is None:
        raise ValueError(f"generated table: row {row['row']!r} has no source (give `source` to the table or the row)")
    results = json.loads((root / source).read_text())
    rows_key = row.get("rows_key", spec.get("rows_key", "rows"))
    rows = results.get(rows_key)
    if isinstance(rows, list):
        return _matching(rows, row.get("where", {}), f"{source}'s {rows_key!r}")
    try:
        return rows[row["row"]]
    except (KeyError, TypeError):
        raise ValueError(f"generated table: {source} has no row {row['row']!r} under {rows_key!r}") from None


def _matching(records: list[dict], where: dict, named: str) -> dict:
    """The one record of a list whose fields have `where`'s values; an error where none does, or several."""
    found = [record for record in records if all(record.get(key) == value for key, value in where.items())]
    if len(found) != 1:
        raise ValueError(f"generated table: {len(found)} records of {named} have {where}, not one")
    return found[0]


def _holder(record: dict, path: str) -> tuple[dict, str]:
    """The mapping that holds `path`'s last key, and that key; an error where a key before it is missing (a wrong
    path)."""
    *parents, last = path.split(".")
    holder = record
    for key in parents:
        if not isinstance(holder, dict) or key not in holder:
            raise ValueError(f"generated table: no {path!r} in the row (missing {key!r})")
        holder = holder[key]
    if not isinstance(holder, dict):
        raise ValueError(f"generated table: {path!r}: {'.'.join(parents)!r} holds no keys")
    return holder, last


def _value(record: dict, path: str):
    """The value at `path`; None where only its last key is missing (a row compared with itself has no
    `versus.<itself>`)."""
    holder, last = _holder(record, path)
    return holder.get(last)


def _cell(column: dict, row: dict, record: dict) -> str:
    if "text" in column:
        return str(row.get(column["text"], ""))
    path = column["value"].format_map(row)  # `{key}`: the row object's text, so each row may read its own value
    value = _value(record, path)
    if value is not None and "unit" in column:
        value /= UNITS[column["unit"]]
    return format_value(value, column.get("format"), record, path)


def format_value(value, style: str | None, record: dict | None = None, path: str = "") -> str:
    """One cell: see the module docstring for the styles."""
    if value is None:
        return ""
    if style == "estimate":
        if isinstance(value, (list, tuple)):
            value, half = value
        else:
            holder, last = _holder(record, path)
            if f"{last}_half_width" not in holder:
                raise ValueError(f"generated table: {path!r} has no {path}_half_width beside it for `estimate`")
            half = holder[f"{last}_half_width"]
        return estimate(value, half)
    if style == "verdict":
        return verdict_cell(value)
    if style == "difference":
        return difference_cell(value)
    if style == "pairs":
        return "; ".join(f"{key}: {item}" for key, item in value.items())
    if style == "seeds":
        return str(len(value) if isinstance(value, (list, tuple)) else value)
    return format(value, style) if style else str(value)


def estimate(mean: float, half_width: float | None, signed: bool = False) -> str:
    """`mean ± half-width` to 3 decimals; the mean alone where one seed gives no interval (None or NaN)."""
    value = f"{mean:+.3f}" if signed else f"{mean:.3f}"
    return value if half_width is None or math.isnan(half_width) else f"{value} ± {half_width:.3f}"


def verdict_cell(difference: dict | None, qualifier: str = "") -> str:
    """A paired difference with its verdict, e.g. `+0.116 ± 0.051 (higher)`, `qualifier` after the verdict in its
    brackets, and the seeds it could not pair (`left_out_note`); blank for none."""
    if not difference:
        return ""
    if "mean" not in difference:
        return left_out_note(difference).strip()
    text = estimate(difference["mean"], difference.get("half_width"), signed=True)
    return f"{text} ({difference['verdict']}{qualifier}){left_out_note(difference)}"


def difference_cell(difference: dict) -> str:
    """A paired difference as a table cell: `+x ± y`, with the seeds it could not pair (`left_out_note`)."""
    if "mean" not in difference:
        return left_out_note(difference).strip()
    return estimate(difference["mean"], difference.get("half_width"), signed=True) + left_out_note(difference)


def left_out_note(difference: dict) -> str:
    """What a paired difference could not pair: `left_out` of the row's seeds, for the reason `left_out_why` (e.g.
    the row and its baseline read different teachers, or the baseline lacks them); "" where it paired them all."""
    if not difference.get("left_out"):
        return ""
    if "mean" not in difference:
        return f" not paired: {difference['left_out_why']} on {seeds_text(difference['left_out'])}"
    return f" [paired on {seeds_text(difference['seeds'])}; {difference['left_out_why']} on {difference['left_out']}]"


def seeds_text(count: int) -> str:
    return f"{count} seed{'' if count == 1 else 's'}"


def _settings_table() -> str:
    """Every tying setting, with the strategies that read it, its default and its help, from the registry (as
    `--help` says them)."""
    from transformers import TrainingArguments

    from hf_layertie import TyingTrainingArguments
    from hf_layertie.trainer import DISTILLATION_DEFAULTS, setting_readers, strategy_help

    lines = ["| setting | read by | default | what |", "|---|---|---|---|"]
    for item in dataclasses.fields(TyingTrainingArguments):
        if item.name in TrainingArguments.__dataclass_fields__ or not item.init:
            continue
        readers, default = setting_readers(item.name)
        help_text = item.metadata.get("help", "")
        if readers:  # less the readers and the default `strategy_help` added: the columns say them
            head, tail = strategy_help("|", readers, default).split("|")
            help_text = help_text.removeprefix(head).removesuffix(tail)
        else:
            value = DISTILLATION_DEFAULTS.get(item.name, item.default)
            default = f"{value:.4g}" if isinstance(value, float) else repr(value)
        default = f"`{default}`" if default else "-"  # unset: the strategy or the agent variant decides (the text says)
        read_by = ", ".join(f"`{mode}`" for mode in readers) or "every strategy"
        help_text = help_text.replace("|", r"\|")  # a bar in a table cell, escaped as GitHub reads it
        lines.append(f"| `{item.name}` | {read_by} | {default} | {help_text} |")
    return "\n".join(lines) + "\n"


def refreshed(text: str, root: Path = REPO_ROOT) -> str:
    """`text` with every generated block rewritten from its source."""
    def replace(match: re.Match) -> str:
        return f"<!-- generated {match.group(1)} -->\n{render(json.loads(match.group(1)), root)}<!-- end generated -->"

    return BLOCK.sub(replace, text)


def stale_blocks(path: Path, root: Path = REPO_ROOT) -> list[str]:
    """The JSON of each block of `path` whose table differs from what its source regenerates."""
    text = path.read_text()
    return [match.group(1) for match in BLOCK.finditer(text) if match.group(2) != render(json.loads(match.group(1)), root)]


def refresh_after_report(report: Path) -> None:
    """Refresh the tables after a report was written where they read reports (`bench/reports/`); a report sent
    elsewhere (an experiment, a check into a temporary folder) changes no table, and the Markdown is left alone."""
    if report.resolve().is_relative_to((REPO_ROOT / "bench" / "reports").resolve()):
        refresh_markdown()


def refresh_markdown(root: Path = REPO_ROOT, strict: bool = False) -> list[Path]:
    """Rewrite every stale generated table from its source. After a report is written (not `strict`), a file with a
    table that cannot be regenerated (its source lacks a row it names: a study still running) keeps all its tables as
    they were, with a warning naming the file and the error; `strict` raises that error instead."""
    updated = []
    for path in markdown_files(root):
        text = path.read_text()
        try:
            new = refreshed(text, root)
        except (ValueError, FileNotFoundError) as error:
            if strict:
                raise
            print(f"warning: {path.relative_to(root)}: tables left as they were: {error}")
            continue
        if new != text:
            write_whole(path, new)
            updated.append(path)
            print(f"updated the tables of {path.relative_to(root)}")
    return updated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="Change nothing; fail naming each stale block.")
    args = parser.parse_args()
    if not args.check:
        refresh_markdown(strict=True)  # errors name the file, the row and the path
        return
    stale = [f"{path.relative_to(REPO_ROOT)}: {spec}" for path in markdown_files() for spec in stale_blocks(path)]
    if stale:
        raise SystemExit("stale generated tables (run python bench/markdown_tables.py):\n" + "\n".join(stale))


if __name__ == "__main__":
    main()
