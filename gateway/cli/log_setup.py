"""How the commands log: text lines by default, or one JSON object per line for log collectors.

Log lines carry what clients send (a request's path, its User-Agent, a tool's type): in a text line a
raw newline, carriage return or ANSI escape in them would start a forged line or repaint the terminal,
and a bidi control (U+202E) would reorder what a reader sees. The text formatter writes every control
and bidi character as an escape (``\\n``, ``\\x1b``, ``\\u202e``), as ``json.dumps`` does for JSON lines.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
# C0 and C1 controls and DEL; Unicode's line/paragraph separators; the bidi marks, embeddings,
# overrides and isolates (U+061C, U+200E-F, U+202A-E, U+2066-9); zero-width and BOM characters
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` on one line, every control and bidi character written as its escape."""
    return _UNSAFE.sub(_escaped, text)


class TextFormatter(logging.Formatter):
    """The text line with its message escaped (one record is one line); a traceback keeps its line
    breaks, but nothing else raw."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        text = super().formatException(ei)
        return "\n".join(escape_controls(line) for line in text.split("\n"))


def configure_logging(verbose: bool) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(TextFormatter(TEXT_FORMAT, datefmt="%H:%M:%S"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
    for noisy in ("httpx", "httpx2", "httpcore", "aiohttp", "asyncio", "multipart"):  # one line per poll or socket op
        logging.getLogger(noisy).setLevel(logging.WARNING)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the access log's fields, request_id."""

    def __init__(self) -> None:
        super().__init__()
        from gateway.serving.wire.request_id import request_id  # here, not at import: `plan` and `gpus` never serve

        self.request_id = request_id

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name}
        entry["message"] = record.getMessage()
        entry.update(getattr(record, "access", {}))  # the access log's fields, each its own key
        if rid := self.request_id.get():
            entry["request_id"] = rid
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)  # ensure_ascii: controls, bidi and all non-ASCII as \u escapes


def use_json_lines() -> None:
    """One JSON object per log line (time, level, logger, message, request_id) for log collectors."""
    for handler in logging.getLogger().handlers:
        handler.setFormatter(JsonFormatter())
