"""How the commands log: text lines by default, or one JSON object per line for log collectors."""

from __future__ import annotations

import json
import logging


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("httpx", "httpx2", "httpcore", "aiohttp", "asyncio", "multipart"):  # one line per poll or socket op
        logging.getLogger(noisy).setLevel(logging.WARNING)


def use_json_lines() -> None:
    """One JSON object per log line (time, level, logger, message, request_id) for log collectors."""
    from gateway.serving.edge import request_id

    class JsonFormatter(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            entry = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name}
            entry["message"] = record.getMessage()
            entry.update(getattr(record, "access", {}))  # the access log's fields, each its own key
            if rid := request_id.get():
                entry["request_id"] = rid
            if record.exc_info:
                entry["exception"] = self.formatException(record.exc_info)
            return json.dumps(entry)

    for handler in logging.getLogger().handlers:
        handler.setFormatter(JsonFormatter())
