"""Operations: API keys at the edge, Prometheus metrics, the /status page in a real headless browser,
JSON logs with request ids, and `gateway gpus` — against the gateway fronting the scripted upstream."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.gatewayproc import GatewayProcess
from tests.integration.test_agent_apis_scripted import Upstream

pytestmark = pytest.mark.engine

KEY = "sk-gateway-test-key"


@pytest.fixture(scope="module")
def ops_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    upstream = Upstream(tmp_path_factory.mktemp("ops-upstream"))
    yield upstream
    upstream.stop()


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory, ops_upstream: Upstream) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("ops")
    upstream = ops_upstream
    key_file = workdir / "keys.txt"
    key_file.write_text("# one key per line\nsk-second-key\n")
    gateway = GatewayProcess(
        workdir, "--backend-url", upstream.url, "--model", "scripted", "--backend-native-apis", "include_usage",
        "--api-key", KEY, "--api-key-file", str(key_file), "--log-format", "json",
    )  # fmt: skip
    with gateway.serving(headers={"Authorization": f"Bearer {KEY}"}):
        yield gateway


CHAT = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}


def test_keys_close_everything_but_health_readiness_and_the_root(guarded: GatewayProcess) -> None:
    assert httpx.get(guarded.url + "/health").status_code == 200
    ready = httpx.get(guarded.url + "/ready")  # for probes: the state, no detail without the key
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}
    assert httpx.head(guarded.url + "/").status_code == 200
    for path in ("/v1/models", "/status", "/metrics"):
        assert httpx.get(guarded.url + path).status_code == 401, path
    refused = httpx.post(guarded.url + "/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer wrong"})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    anthropic_refused = httpx.post(guarded.url + "/v1/messages", json={**CHAT, "max_tokens": 8})
    assert anthropic_refused.status_code == 401 and anthropic_refused.json()["type"] == "error"


def test_bearer_x_api_key_and_the_key_file_are_accepted(guarded: GatewayProcess) -> None:
    for headers in ({"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}, {"Authorization": "Bearer sk-second-key"}):
        assert httpx.post(guarded.url + "/v1/chat/completions", json=CHAT, headers=headers).status_code == 200
    client = openai.OpenAI(base_url=guarded.url + "/v1", api_key=KEY, max_retries=0)
    assert client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}]).choices


def test_metrics_count_requests_tokens_and_show_state(guarded: GatewayProcess) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    httpx.post(guarded.url + "/v1/chat/completions", json=CHAT, headers=headers)
    text = httpx.get(guarded.url + "/metrics", headers=headers).text
    assert 'gateway_requests_total{route="/v1/chat/completions",status="200"}' in text
    assert 'gateway_requests_total{route="/v1/chat/completions",status="401"}' in text
    assert 'gateway_tokens_total{direction="in"}' in text and 'gateway_tokens_total{direction="out"}' in text
    assert 'gateway_backend_state{state="ready"} 1.0' in text
    assert "gateway_queue_depth 0.0" in text and "gateway_request_seconds_bucket" in text
    assert "gateway_context_length 4096.0" in text


def test_request_ids_are_returned_and_propagated(guarded: GatewayProcess, ops_upstream: Upstream) -> None:
    headers = {"Authorization": f"Bearer {KEY}", "X-Request-Id": "trace-me-123"}
    answer = httpx.post(guarded.url + "/v1/chat/completions", json=CHAT, headers=headers)
    assert answer.headers["x-request-id"] == "trace-me-123"
    assert ops_upstream.seen('"request_id": "trace-me-123"'), "the engine should receive the same id"
    fresh = httpx.post(guarded.url + "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {KEY}"})
    assert len(fresh.headers["x-request-id"]) == 32


def test_logs_are_one_json_object_per_line(guarded: GatewayProcess) -> None:
    lines = [line for line in guarded.log().splitlines() if line.strip()]
    parsed = [json.loads(line) for line in lines]  # every line, uvicorn's own included
    assert parsed and all({"time", "level", "logger", "message"} <= set(entry) for entry in parsed)
    assert any("backend at" in entry["message"] for entry in parsed)


def test_the_status_page_renders_the_decision_in_a_real_browser(guarded: GatewayProcess, tmp_path: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.fail("chromium is missing: the README's test command installs Debian's chromium")
    proxy = subprocess.Popen(  # the browser cannot send the key itself: a one-route relay adds it
        [sys.executable, "-c", _KEYED_RELAY, str(guarded.port), KEY], stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(proxy.stdout.readline())  # type: ignore[union-attr]
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom"]  # fmt: skip
        run = subprocess.run(
            [browser, *flags, f"http://127.0.0.1:{port}/status"], capture_output=True, text=True, timeout=120
        )
    finally:
        proxy.kill()
        proxy.wait()
        if proxy.stdout:
            proxy.stdout.close()
    dom = run.stdout
    assert "<h2>Decision</h2>" in dom and 'id="decision"' in dom, run.stderr[-2000:]
    assert "fronting the backend at" in dom and 'id="state">ready<' in dom


_KEYED_RELAY = """
import http.server, sys, urllib.request
target, key = int(sys.argv[1]), sys.argv[2]
class Relay(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        headers = {"Authorization": "Bearer " + key, "Accept": self.headers.get("Accept", "")}
        request = urllib.request.Request(f"http://127.0.0.1:{target}{self.path}", headers=headers)
        with urllib.request.urlopen(request) as answer:
            body = answer.read()
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.headers["Content-Type"])
            self.end_headers()
            self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Relay)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def test_gpus_command_prints_the_inventory() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "gateway", "gpus", "--gpus", "1x12GiB,1x24GiB@8.6", "--ram", "64GiB", "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    data = json.loads(run.stdout)
    gpus = [d["compute_capability"] for d in data["devices"] if d["kind"] == "gpu"]
    assert data["source"] == "simulated" and gpus == ["8.9", "8.6"]
    [host] = [d for d in data["devices"] if d["kind"] == "cpu"]
    assert host["total_bytes"] == 64 * 1024**3
