"""The words and layout of bench's report pages: one Jinja2 template a page beside this file (`*.md.jinja`), so that
a reader edits a report's sentences, headings and tables in one place, while the Python that reads the records
computes the numbers. `common.md.jinja` holds the sentences several pages share.

A missing value fails (`StrictUndefined`) instead of printing nothing. A paragraph is one line of Markdown, but may be
wrapped in its template inside `{% filter paragraph %}`: its lines are joined with single spaces. A line ending in a
block tag (`{% endfilter %}`, `{% endif %}`...) loses its newline (`trim_blocks`), so two empty lines follow a paragraph
to leave one blank line, and `+%}` keeps a newline a line needs. `bench/tests/test_committed_reports.py` checks that the
committed reports are still what their records give, byte for byte."""

from __future__ import annotations

from pathlib import Path

import jinja2

from ..markdown_tables import difference_cell, estimate, seeds_text, verdict_cell

FOLDER = Path(__file__).parent


def paragraph(text: str) -> str:
    """A template's wrapped lines as one line of Markdown: each line stripped, joined with single spaces."""
    return " ".join(line.strip() for line in text.strip().splitlines())


ENVIRONMENT = jinja2.Environment(
    loader=jinja2.FileSystemLoader(FOLDER), undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
    trim_blocks=True, lstrip_blocks=True, autoescape=False,
)  # fmt: skip


def _strict(function):
    """`function` as a filter that fails on a missing value with Jinja's own error, as printing one does, instead of
    the TypeError formatting it would raise."""
    def strict(*args, **kwargs):
        for value in (*args, *kwargs.values()):
            if isinstance(value, jinja2.Undefined):
                value._fail_with_undefined_error()
        return function(*args, **kwargs)

    return strict


ENVIRONMENT.filters |= {
    "paragraph": paragraph,
    "fmt": _strict(format),  # `{{ value | fmt(".3f") }}`: Python's format spec, as an f-string writes it
    "estimate": _strict(estimate),
    "difference": _strict(lambda difference: "" if difference is None else difference_cell(difference)),
    "verdict": _strict(verdict_cell),
    "seeds": _strict(seeds_text),
}


def render(name: str, **context) -> str:
    """The page the template `name` (in this folder) writes from `context`."""
    return ENVIRONMENT.get_template(name).render(**context)
