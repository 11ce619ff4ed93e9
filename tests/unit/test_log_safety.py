"""Log lines cannot be forged or flooded by a request: the text log escapes control and bidi characters
as the JSON log does (a path with %0a once wrote a second, forged `gateway.access` line, also when
unauthenticated on a keyed gateway), and a request that drops 99,000 tools is one warning, not 198,001."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from starlette.testclient import TestClient

from gateway.cli.log_setup import TEXT_FORMAT, JsonFormatter, TextFormatter, escape_controls
from gateway.serving.dialects import responses_api
from gateway.serving.edge.middleware import ApiKeys, Receive, RequestMetrics, Scope, Send

FORGED = "gateway.access INFO GET /v1/models 200 1 ms in=? out=? client=admin id=forged"
# what a client can put in a path: LF, CR, an ANSI colour, NUL, a right-to-left override, NEL, LS
HOSTILE = {
    "lf": ("%0a", "\\n"),
    "crlf": ("%0d%0a", "\\r\\n"),
    "ansi": ("%1b[31m", "\\x1b[31m"),
    "nul": ("%00", "\\x00"),
    "rlo": ("%e2%80%ae", "\\u202e"),
    "nel": ("%c2%85", "\\x85"),
    "line-separator": ("%e2%80%a8", "\\u2028"),
}


async def _ok(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


@pytest.fixture
def text_log() -> Iterator[io.StringIO]:
    """What the gateway's loggers write, through the text formatter `serve` installs."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(TextFormatter(TEXT_FORMAT, datefmt="%H:%M:%S"))
    root = logging.getLogger("gateway")
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.INFO)  # setLevel, not .level: it clears the loggers' cached levels
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


@pytest.mark.parametrize("keys", [(), ("sk-right",)], ids=["open", "keyed-unauthenticated"])
@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_path_cannot_forge_an_access_line(text_log: io.StringIO, keys: tuple[str, ...], name: str) -> None:
    encoded, escaped = HOSTILE[name]
    client = TestClient(RequestMetrics(ApiKeys(_ok, keys), CollectorRegistry()))
    answer = client.get(f"/v1/x{encoded}{FORGED.replace(' ', '%20')}")
    assert answer.status_code == (401 if keys else 200)
    lines = text_log.getvalue().splitlines()
    assert len(lines) == 1, lines  # one request, one line
    assert f"/v1/x{escaped}gateway.access" in lines[0]
    assert all(char.isprintable() for char in lines[0]), repr(lines[0])


def test_every_control_and_bidi_character_is_escaped_and_printable_text_kept() -> None:
    controls = (
        "".join(map(chr, [*range(0x20), *range(0x7F, 0xA0)])) + "\u061c\u200e\u200f\u202a\u202e\u2066\u2069\ufeff"
    )
    escaped = escape_controls(f"a{controls}b é ü ✓ 名")
    assert escaped.startswith("a\\x00") and escaped.endswith("b é ü ✓ 名")
    assert all(char.isprintable() for char in escaped)


def test_the_json_log_escapes_the_same_characters(text_log: io.StringIO) -> None:
    logging.getLogger("gateway").handlers[-1].setFormatter(JsonFormatter())
    client = TestClient(RequestMetrics(ApiKeys(_ok, ()), CollectorRegistry()))
    client.get("/v1/x%0a%1b%e2%80%aey")
    (line,) = text_log.getvalue().splitlines()
    assert json.loads(line)["path"] == "/v1/x\n\x1b\u202ey" and line.isascii()


def test_a_request_dropping_many_tools_is_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    tools = [{"type": "web_search"}] * 60_000 + [{"type": f"kind-{n}"} for n in range(39_000)]
    tools.append({"type": "namespace", "tools": [{"type": "file_search"}, {"type": "function", "name": "f"}]})
    body = {"input": "hi", "tools": tools}
    with caplog.at_level(logging.WARNING, logger="gateway.responses"):
        chat = responses_api.to_chat(body, "m")
        reply = {"choices": [{"message": {"role": "assistant", "content": "ok"}}], "usage": {}}
        shown = responses_api.from_chat(reply, body, "m")
    assert [tool["function"]["name"] for tool in chat["tools"]] == ["f"] and len(shown["tools"]) == 1
    (warning,) = caplog.records
    said = warning.getMessage()
    assert "dropping 99001 tool(s)" in said and "'web_search' x60000" in said and "38997 other types" in said
    assert len(said) < 400
