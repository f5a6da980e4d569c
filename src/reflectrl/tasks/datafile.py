"""Reading a user's file of problems (the ``data`` task): JSON lines, a JSON list, CSV or Parquet, each optionally
gzip-compressed (``.gz``). Every row comes back with where it is (``line 7``, ``row 7``), so that an error names it.

Bad data ends in one :class:`~reflectrl.errors.ConfigError` line that names the file and the line or row.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import ConfigError

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv", ".tsv": "tsv",
           ".parquet": "parquet"}
"""File suffixes (before an optional ``.gz``) and the format each is read as."""


def file_format(path: Path) -> str:
    """The format of ``path`` from its suffix (``data.jsonl.gz`` is JSON lines), or a ConfigError naming the ones
    read."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    fmt = FORMATS.get(suffixes[-1]) if suffixes else None
    if fmt is None:
        raise ConfigError(f"data file {path}: unknown format; name it .jsonl, .json, .csv, .tsv or .parquet "
                          "(optionally .gz)")
    return fmt


def _text(path: Path, label: str = "data file") -> str:
    raw = path.read_bytes()
    if path.suffix.lower() == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise ConfigError(f"{label} {path}: not a gzip file ({exc})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{label} {path}, line {line}: not UTF-8 text (byte {exc.start})") from None


def read_rows(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """The rows of a data file as (where, row): ``where`` is ``line N`` (JSON lines, CSV: the line the row starts on)
    or ``item N`` / ``row N`` (a JSON list, Parquet; counted from 1). A missing or unreadable file, a line that is not
    JSON, a row that is not an object and an empty file end in a ConfigError naming the file (and the line)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"data file {p} does not exist" if not p.exists() else f"data file {p} is not a file")
    fmt = file_format(p)
    try:
        rows = list(_READERS[fmt](p))
    except OSError as exc:
        raise ConfigError(f"data file {p} cannot be read: {exc}") from None
    if not rows:
        raise ConfigError(f"data file {p} holds no rows")
    return rows


def json_lines(path: Path, label: str = "data file") -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of every non-blank line of a JSON lines file (``.gz`` too); a line that is not JSON, or
    not an object, ends in one ConfigError naming ``label``, the file and the line."""
    for n, line in enumerate(_text(path, label).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{label} {path}, line {n}: not JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{label} {path}, line {n}: a row must be a JSON object, got {type(row).__name__}")
        yield n, row


def _jsonl(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    return ((f"line {n}", row) for n, row in json_lines(path))


def _json(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        data = json.loads(_text(path))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"data file {path}, line {exc.lineno}: not JSON ({exc.msg} at column {exc.colno}); a .json "
                          "file holds one list of objects (JSON lines: name it .jsonl)") from None
    if isinstance(data, dict) and len(data) == 1 and isinstance(next(iter(data.values())), list):
        data = next(iter(data.values()))  # {"data": [...]}
    if not isinstance(data, list):
        raise ConfigError(f"data file {path}: a .json file must hold a list of objects, got {type(data).__name__}")
    for n, row in enumerate(data, 1):
        if not isinstance(row, dict):
            raise ConfigError(f"data file {path}, item {n}: a row must be a JSON object, got {type(row).__name__}")
        yield f"item {n}", row


def _delimited(path: Path, delimiter: str) -> Iterator[tuple[str, dict[str, Any]]]:
    reader = csv.reader(io.StringIO(_text(path), newline=""), delimiter=delimiter)
    header: list[str] | None = None
    start = 1
    try:
        for fields in reader:
            line, start = start, reader.line_num + 1
            if not any(f.strip() for f in fields):
                continue
            if header is None:
                header = [h.strip() for h in fields]
                continue
            if len(fields) != len(header):
                raise ConfigError(f"data file {path}, line {line}: {len(fields)} fields, but the header has "
                                  f"{len(header)}")
            yield f"line {line}", {h: _cell(v) if h in LIST_COLUMNS else v for h, v in zip(header, fields) if h}
    except csv.Error as exc:
        raise ConfigError(f"data file {path}, line {reader.line_num}: not CSV ({exc})") from None


LIST_COLUMNS = {"choices", "options", "messages"}
"""The CSV columns whose cells may hold JSON lists (read as lists); every other cell is text."""


def _cell(value: str) -> Any:
    """A CSV cell of a list column: a JSON list or object as its value, anything else as text."""
    text = value.strip()
    if text[:1] in "[{" and text[-1:] in "]}":
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return value
    return value


def _parquet(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(f"data file {path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    source: Any = io.BytesIO(gzip.decompress(path.read_bytes())) if path.suffix.lower() == ".gz" else str(path)
    try:
        table = pq.read_table(source)
    except Exception as exc:  # pyarrow's own errors (not Parquet, truncated) have no common base but Exception
        raise ConfigError(f"data file {path}: not a Parquet file ({type(exc).__name__}: {exc})") from None
    for n, row in enumerate(table.to_pylist(), 1):
        yield f"row {n}", row


_READERS = {"jsonl": _jsonl, "json": _json, "csv": lambda p: _delimited(p, ","), "tsv": lambda p: _delimited(p, "\t"),
            "parquet": _parquet}
