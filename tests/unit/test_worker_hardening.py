"""`gateway worker` under a loaded machine and bad input: a server slow to listen is waited for while it
lives, a taken port is refused, a failed start is one line, bad flags are refused, and its HTTP side
answers like `serve`'s (JSON errors, the header cap, one key check)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gateway.cli.commands import main
from gateway.core.devices import GIB, Inventory, parse_gpu_spec
from gateway.core.errors import GatewayError
from gateway.core.process import free_port
from gateway.nodes import worker as worker_module
from gateway.nodes.worker import Worker, WorkerConfig, create_app
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
# a stand-in ggml-rpc-server: prints its device list, waits DELAY seconds, then listens on -p (or exits).
# Its knobs are files beside it (SCRIPT.delay, SCRIPT.exit): a device server starts with an explicit
# environment, not the worker's, so an environment variable would not reach it.
FAKE = """#!{python}
import socket, sys, time
from pathlib import Path
def knob(name, default):
    path = Path(sys.argv[0] + "." + name)
    return path.read_text() if path.exists() else default
args = sys.argv[1:]
port = int(args[args.index("-p") + 1])
print("Starting RPC server v3.0.0", flush=True)
print("devices: CPU", flush=True)
if knob("exit", ""):
    sys.exit(7)
time.sleep(float(knob("delay", "0")))  # slow to listen: the test's input
server = socket.socket()
server.bind((args[args.index("-H") + 1], port))
server.listen(8)
while True:
    connection, _ = server.accept()
    connection.close()
"""


@pytest.fixture
def fake_rpc(tmp_path: Path) -> Path:
    script = tmp_path / "ggml-rpc-server"
    script.write_text(FAKE.format(python=sys.executable))
    script.chmod(0o755)
    return script


def _worker(tmp_path: Path, command: Path, rpc_port: int, gpus: str = "1x1GiB") -> Worker:
    config = WorkerConfig(first_port=rpc_port, gpus=gpus, log_dir=tmp_path, api_keys=("k",))
    machine = Inventory(parse_gpu_spec(gpus), 8 * GIB, 8 * GIB, source="simulated")
    return Worker(config, machine, [str(command)])


def test_a_server_slow_to_listen_is_waited_for_while_it_lives(
    tmp_path: Path, fake_rpc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "SERVER_START_S", 0.05)  # a machine far slower than its budget
    fake_rpc.with_name(fake_rpc.name + ".delay").write_text("0.2")
    worker = _worker(tmp_path, fake_rpc, free_port())

    async def scenario() -> bool:
        await worker.start()
        try:
            return worker.servers[0].running
        finally:
            await worker.stop()

    assert asyncio.run(scenario())


def test_a_taken_rpc_port_is_refused_not_advertised(tmp_path: Path, fake_rpc: Path) -> None:
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen(4)
    worker = _worker(tmp_path, fake_rpc, other.getsockname()[1])
    try:
        with pytest.raises(GatewayError, match="taken"):
            asyncio.run(worker.start())
    finally:
        other.close()
    assert all(server.child is None for server in worker.servers)  # nothing was started


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """`gateway worker ARGS` in this process (its exit status, what it wrote to stderr): an exception
    main() does not turn into its one line fails the test, as its traceback would in a terminal.
    test_its_headers_are_capped_before_the_key starts the command itself."""
    capsys.readouterr()
    status = main(["worker", *args])
    return status, capsys.readouterr().err


@pytest.mark.timeout(30)  # a worker that started in spite of the fault would serve until stopped
def test_a_failed_start_is_one_line_not_a_traceback(
    tmp_path: Path, fake_rpc: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_rpc.with_name(fake_rpc.name + ".exit").write_text("1")
    status, stderr = _cli(
        capsys, "--api-key", "k", "--port", str(free_port()), "--rpc-port", str(free_port()), "--gpus", "1x1GiB",
        "--rpc-server-command", str(fake_rpc), "--state-dir", str(tmp_path),
    )  # fmt: skip
    assert status == 1, stderr
    assert "Traceback" not in stderr and "gateway: error: ggml-rpc-server" in stderr, stderr


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("flags", "said"), [(["--port", "99999"], "--port 99999"), (["--api-key", ""], "empty --api-key")]
)
def test_bad_flags_are_refused_in_one_line(
    tmp_path: Path, fake_rpc: Path, flags: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = {"--api-key": "k", "--port": str(free_port()), "--rpc-port": str(free_port())}
    base.update(dict(zip(flags[::2], flags[1::2], strict=True)))
    args = [part for pair in base.items() for part in pair]
    status, stderr = _cli(capsys, *args, "--rpc-server-command", str(fake_rpc), "--state-dir", str(tmp_path))
    assert status == 1 and said in stderr, stderr


def test_its_http_side_answers_like_serves(tmp_path: Path, fake_rpc: Path) -> None:
    worker = _worker(tmp_path, fake_rpc, free_port())
    client = TestClient(create_app(worker, ("secret",)))  # no `with`: the servers are not started
    assert client.get("/inventory", headers={"Authorization": "Bearer wrong", "x-api-key": "secret"}).status_code == 200
    missing, wrong_method = (
        client.get("/nope", headers={"x-api-key": "secret"}),
        client.post("/inventory", headers={"x-api-key": "secret"}),
    )
    assert missing.status_code == 404 and "error" in missing.json()
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()


def _connect(port: int) -> socket.socket | None:
    try:
        return socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:
        return None


def test_its_headers_are_capped_before_the_key(tmp_path: Path, fake_rpc: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "worker", "--api-key", "k", "--port", str(port),
         "--rpc-port", str(free_port()), "--gpus", "1x1GiB", "--rpc-server-command", str(fake_rpc),
         "--state-dir", str(tmp_path)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        conn = wait_until(lambda: _connect(port), what="the worker to listen", timeout_s=30, interval_s=0.1)
        with conn:
            conn.sendall(b"GET /inventory HTTP/1.1\r\nHost: x\r\nX-Pad: ")
            answer = b""
            try:
                for _ in range(64):
                    conn.sendall(b"a" * 16384)  # 1 MiB of a header that never ends
                answer = conn.recv(100)
            except OSError:
                answer = answer or conn.recv(100)
        assert answer.startswith(b"HTTP/1.1 431"), answer
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_a_watch_loop_that_raises_is_logged_and_run_again(caplog: pytest.LogCaptureFixture) -> None:
    """The worker's watches (its device servers, the rank's lease, the replicas' leases) run under
    ``kept_running``: an exception nobody foresaw is logged with its traceback and the loop runs again.
    Before, the task ended silently (no lease ever ran out) and its exception surfaced only at stop."""
    runs: list[int] = []

    async def lease_loop() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            raise KeyError("a state nobody foresaw")

    with caplog.at_level(logging.ERROR, logger="gateway.worker"):
        asyncio.run(asyncio.wait_for(worker_module.kept_running("replica leases", lease_loop, retry_s=0.01), 5))
    assert runs == [0, 1]
    failed = [r for r in caplog.records if "replica leases failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None and failed[0].exc_info[0] is KeyError
