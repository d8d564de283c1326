"""Reading LAMBADA passages and splitting them into context and target word."""

import json
import os
from pathlib import Path


def split_context_target(text: str) -> tuple[str, str]:
    """Split a passage into (context, " " + last word), as lm-eval-harness `lambada_openai` does.

    The split is at the LAST space character (`text.split(" ")`), not at any whitespace, so a last
    chunk such as "of\\n\\nPower" (7 of the 5,153 test passages) stays whole. The space goes with the
    target because GPT-2's byte-level BPE encodes a word together with its leading space: the
    target " door" is one token where "door" is another.
    """
    if not text.strip():
        raise ValueError(f"a LAMBADA passage must not be empty, got {_preview(text)}")
    context, separator, word = text.rpartition(" ")
    if not separator or not context.strip():
        raise ValueError(f"a LAMBADA passage needs context before its last word, got {_preview(text)}")
    if not word.strip():
        raise ValueError(f"a LAMBADA passage must end with a word, not a space, got {_preview(text)}")
    return context, " " + word


def read_lambada_jsonl(path: str | os.PathLike) -> list[str]:
    """Read passages from a JSON-lines file in OpenAI's format: one `{"text": ...}` per line.

    Blank lines are skipped. Every other line must be UTF-8 text holding a passage with context and a
    last word; the first bad line raises a ValueError naming the file and the line number. Lines are
    decoded one by one so that a binary or compressed file is reported at its first bad line too.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"LAMBADA file not found: {path} (run_lambada.py reads it from --lambada_file)")
    with path.open("rb") as lines:
        passages = [
            _parse_line(line, f"{path}, line {number}")
            for number, line in enumerate(lines, start=1)
            if line.strip()
        ]
    if not passages:
        raise ValueError(f"{path}: no passages (the file is empty)")
    return passages


def _decode(line: bytes, where: str) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{where}: not UTF-8 text (byte {error.start} is {line[error.start:error.start + 1]!r}); expected JSON "
            f"lines, is the file binary or compressed?"
        ) from None


def _parse_line(raw: bytes, where: str) -> str:
    line = _decode(raw, where)
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not valid JSON ({error.msg})") from None
    if not isinstance(record, dict) or "text" not in record:
        raise ValueError(f'{where}: expected a JSON object with a "text" key, got {_preview(line.strip())}')
    text = record["text"]
    if not isinstance(text, str):
        raise ValueError(f'{where}: "text" must be a string, got {type(text).__name__}')
    try:
        split_context_target(text)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    return text


def _preview(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
