"""The result channel: bounded capture of a child's output and the nonce-validated records it reports."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from .base import CHANNEL_CAP


class Capped:
    """Keep the first `limit` bytes of a stream, count (and discard) the rest."""

    def __init__(self, limit: int):
        self.data, self.limit, self.dropped = bytearray(), limit, 0

    def feed(self, chunk: bytes) -> None:
        room = max(0, self.limit - len(self.data))
        self.data += chunk[:room]
        self.dropped += len(chunk) - min(room, len(chunk))

    def text(self) -> str:
        text = self.data.decode("utf-8", "replace")
        return text + f"\n...[{self.dropped} more bytes truncated]" if self.dropped else text


class Channel:
    """Result records `<nonce> <kind> <index> <0|1> <info>`; lines without the nonce are ignored."""

    KINDS = frozenset({"setup", "define", "test", "done"})

    def __init__(self, nonce: str):
        self.nonce, self.buf, self.seen = nonce.encode(), b"", 0
        self.records: dict[tuple[str, int], tuple[bool, str]] = {}

    def feed(self, chunk: bytes) -> None:
        self.seen += len(chunk)
        if self.seen > CHANNEL_CAP:
            return
        *lines, self.buf = (self.buf + chunk).split(b"\n")
        for line in lines:
            self._parse(line)

    def _parse(self, line: bytes) -> None:
        parts = line.split(b" ", 4)
        if len(parts) != 5 or not secrets.compare_digest(parts[0], self.nonce):
            return
        kind, index, ok = parts[1].decode("ascii", "replace"), parts[2], parts[3]
        if kind in self.KINDS and index.isdigit() and ok in (b"0", b"1"):
            self.records.setdefault((kind, int(index)), (ok == b"1", parts[4].decode("utf-8", "replace")))

    def get(self, kind: str, index: int = 0) -> tuple[bool, str] | None:
        """The first valid record of this kind and index."""
        return self.records.get((kind, index))

    def finished(self) -> bool:
        """Whether a (validated) final record arrived."""
        return any(kind == "done" for kind, _ in self.records)


@dataclass
class Outcome:
    """Everything observed about one finished child."""

    channel: Channel
    stdout: Capped
    stderr: Capped
    returncode: int | None = None
    timed_out: bool = False
    duration_s: float = 0.0
