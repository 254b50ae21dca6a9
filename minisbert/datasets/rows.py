"""Reading dataset files line by line, with errors that name the file and the line.

Every reader in this package opens files and reports malformed lines through these few functions,
so a bad line always reads `FILE, line N: what is wrong; fix or remove that line`.

- Text is UTF-8, decoded line by line so that a stray invalid byte is reported with its line; a
  byte-order mark at the start (as spreadsheet programs write it) is dropped. A file whose name
  ends in `.gz` is decompressed on the fly.
- Only "\\n" ends a line: a stray "\\r" or other control character inside a sentence cannot split a
  row in two; a trailing "\\r" (SICK's test file has Windows line endings) is dropped.
- Tab-separated files are split on tabs, line by line, with no CSV quoting: some STS benchmark
  sentences begin with a double quote that never closes, and a CSV reader then swallows the
  following lines into one field (Python's csv module finds 1,119 of the 1,379 test pairs).
- Blank lines are skipped.
- Files are written whole or not at all (fileio.atomic_write).

Checked in tests/datasets/test_datasets.py.
"""

import csv
import gzip
import json
from pathlib import Path
from typing import Iterable, Iterator

from ..common.fileio import atomic_write


def malformed(path: Path, line_number: int, problem: str) -> ValueError:
    return ValueError(f"{path}, line {line_number}: {problem}; fix or remove that line")


def number(path: Path, line_number: int, text: str, kind: type, what: str):
    """`kind(text)` (int or float), or a malformed-line error naming `what`."""
    try:
        return kind(text)
    except ValueError:
        expected = "an integer" if kind is int else "a number"
        raise malformed(path, line_number, f"{what} {text!r} is not {expected}") from None


def open_binary(path: Path):
    return gzip.open(path, "rb") if Path(path).name.endswith(".gz") else open(path, "rb")


def lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text with its line ending) for every line of a UTF-8 file."""
    with open_binary(path) as raw:
        for line_number, data in enumerate(raw, start=1):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as error:
                raise malformed(path, line_number, f"byte {error.start + 1} of the line, {data[error.start]:#04x}, "
                                                   "is not UTF-8 (save the file as UTF-8)") from None
            yield line_number, text.removeprefix("\ufeff") if line_number == 1 else text


def tab_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(1-based line number, fields split on tabs) for every non-blank line."""
    for line_number, line in lines(path):
        line = line.rstrip("\r\n")
        if line.strip():
            yield line_number, line.split("\t")


def json_rows(path: Path) -> Iterator[tuple[int, dict]]:
    """(1-based line number, JSON object) for every non-blank line of a .jsonl(.gz) file."""
    for line_number, line in lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise malformed(path, line_number, f"not valid JSON ({error.msg})") from None
        if not isinstance(row, dict):
            raise malformed(path, line_number, "expected a JSON object {...}")
        if "\\ud" in line.lower():  # a JSON escape of a surrogate, valid only as half of a pair
            check_unicode(path, line_number, row)
        yield line_number, row


def check_unicode(path: Path, line_number: int, row: dict) -> None:
    """Refuse, by file, line and field, a string holding a lone surrogate: JSON can spell one (the
    escape \\ud800 alone), Python reads it as a str, and the tokenizer could only refuse it later
    without knowing where it came from."""
    for key, value in row.items():
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as error:
                raise malformed(path, line_number, f"field {key!r} is not valid Unicode: character {error.start} "
                                f"is {value[error.start]!r} ({error.reason})") from None


def csv_records(path: Path, columns: tuple[str, ...], delimiter: str = ",") -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, {column: field}) for every record of a CSV file whose header names at least
    `columns`. Unlike the tab-separated files above, double quotes are honoured, so a quoted field
    may hold the delimiter or span lines; the line number is where the record ends."""
    reader = csv.reader((line for _, line in lines(path)), delimiter=delimiter)
    header = next(reader, [])
    missing = [c for c in columns if c not in header]
    if missing:
        raise ValueError(f"{path}: the header (line 1) lacks the column(s) {missing}; the columns found are "
                         f"{header}. The first line must name the columns")
    for fields in reader:
        if not fields:
            continue
        if len(fields) != len(header):
            raise malformed(path, reader.line_num, f"expected {len(header)} fields as in the header, found "
                                                   f"{len(fields)} (quote a field that holds {delimiter!r})")
        yield reader.line_num, dict(zip(header, fields))


def write_lines(path: Path, rows: Iterable[str]) -> None:
    """Write each string of `rows` as one line of UTF-8 text, atomically."""
    def write(tmp: Path):
        with open(tmp, "w", encoding="utf-8", newline="\n") as out:
            for row in rows:
                out.write(row + "\n")

    atomic_write(Path(path), write)
