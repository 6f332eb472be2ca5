"""The one JSONL reader: training data, evaluation tasks and demo prompt files all go through `jsonl_lines`."""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class JsonlLine:
    """One non-blank line: `location` is "file:line" (1-based); `value` the parsed JSON, or None with `problem` saying
    what is wrong (invalid UTF-8, invalid JSON); `text` the decoded line (None when it is not UTF-8)."""

    location: str
    text: str | None
    value: Any = None
    problem: str | None = None


def jsonl_lines(path: str | Path, parse: bool = True) -> Iterator[JsonlLine]:
    """Stream a JSONL file line by line. Each line is decoded on its own, so one bad line is reported with its
    number and the rest are still read; lines are split on b"\\n" only (U+2028 inside a JSON string is not a line
    end); a UTF-8 byte-order mark is dropped. With `parse=False` only the text is given."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            where = f"{path}:{number}"
            if number == 1:
                raw = raw.removeprefix(codecs.BOM_UTF8)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                yield JsonlLine(where, None, problem=(
                    f"invalid UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1}); save the file as UTF-8"))
                continue
            if not text.strip():
                continue
            if not parse:
                yield JsonlLine(where, text)
                continue
            try:
                yield JsonlLine(where, text, value=json.loads(text))
            except json.JSONDecodeError as err:
                yield JsonlLine(where, text, problem=(
                    f"not valid JSON ({err.msg} at column {err.colno}); each line must be one JSON object"))


def read_jsonl(path: str | Path) -> list[Any]:
    """Every line's value; the first bad line raises `ValueError` naming its file and line."""
    values = []
    for line in jsonl_lines(path):
        if line.problem:
            raise ValueError(f"{line.location}: {line.problem}")
        values.append(line.value)
    return values
