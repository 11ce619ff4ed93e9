"""``gateway worker``: lend this node's devices to a head on another node.

It reads the GPUs (NVML, or a simulated ``--gpus`` spec), starts one device server per GPU (one for
the CPU on a machine without GPUs), each bound to ``--host`` only, and answers the head's
``GET /inventory`` (API key required) with its devices, their memory and endpoints, its RAM and the
engine build. The servers run under :mod:`gateway.core.reaper`, so they die with the worker even
when it is SIGKILLed; a server that exits is started again (and reported as not running meanwhile).

What a device server is comes from the engine that lends devices (``gateway.backends.registry.LENDER``,
today llama.cpp's ``ggml-rpc-server``, which has no authentication: bind ``--host`` to an address on
a private network between the nodes). This module is the engine-neutral shell around it.

A simulated GPU is served by a CPU server and reported with the simulated size (the head plans with
that size; the server itself has no limit): what the tests and ``plan`` use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.backends import registry
from gateway.backends.registry import LENDER
from gateway.core.devices import GIB, MIB, Device, Inventory, host_ram, inventory, parse_size, probe_nvml
from gateway.core.errors import ConfigError, GatewayError
from gateway.core.process import ChildProcess
from gateway.core.settings import Settings
from gateway.nodes import start_request
from gateway.nodes.followers import Followers, Hosted, describe, hosted_engines
from gateway.nodes.replica_servers import ReplicaServers, Served, served_engines
from gateway.nodes.start_request import REPLICA_NAME, Refused, ServerStart, StartRequest
from gateway.serving.edge.http_limits import bounded_protocol
from gateway.serving.edge.middleware import ApiKeys, ASGIApp
from gateway.serving.edge.request_body import parse_object, read_body
from gateway.serving.edge.run_served import run_served
from gateway.serving.wire.error_shapes import OPENAI, ApiError, as_api_error

log = logging.getLogger("gateway.worker")
CLIENT_TIMEOUT_S = 10.0  # a request's head or body, whole (the gateway's default is 60 s)

DEFAULT_PORT = 50100  # the worker's HTTP side; its device servers take first_port, first_port + 1, …
SERVER_START_S = 15.0  # after this a server that is still alive is waited for, with a log line
SERVER_START_CEILING_S = 180.0  # ... but not beyond this: a server that never listens is a failure
RESTART_DELAY_S = 2.0
DEVICE_SERVER_STOP_S = 3.0  # a device server (ggml-rpc-server) holds nothing to save: a short grace


async def kept_running(name: str, loop: Callable[[], Awaitable[None]], retry_s: float = RESTART_DELAY_S) -> None:
    """One of the worker's watch loops, for as long as the worker runs: an exception nobody foresaw is logged
    with its traceback and the loop runs again after ``retry_s``. Unkept, the task ended silently (leases
    never ran out, an exited device server was never started again) and its exception surfaced only at stop."""
    while True:
        try:
            await loop()
            return
        except Exception:
            log.exception("worker: %s failed; running it again in %g s", name, retry_s)
            await asyncio.sleep(retry_s)


def _kept_task(name: str, loop: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
    return asyncio.create_task(kept_running(name, loop), name=name)


@dataclass(frozen=True)
class WorkerConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    first_port: int = LENDER.default_port  # the device servers take first_port, first_port + 1, …
    name: str = ""  # unset: the host name
    gpus: str | None = None  # simulated spec ("2x24GiB"): CPU servers reported with these sizes
    cpu_memory: str | None = None  # without GPUs: the size to report for the CPU device (default: RAM available)
    threads: int | None = None
    api_keys: tuple[str, ...] = ()
    server_command: tuple[str, ...] | None = None  # the device server to run; unset: the one installed
    log_dir: Path = Path(".")
    engine_settings: Settings | None = None  # the settings the engines' installations are read from (vllm_command…)


@dataclass(frozen=True)
class LentDevice:
    """One device this worker serves: as the head will plan it, and how its server is started."""

    gpu: Device
    local_gpu: int | None  # the NVML index of the GPU its server runs on (None: the CPU)
    port: int
    simulated: bool


def devices(config: WorkerConfig, machine: Inventory) -> list[LentDevice]:
    """The devices to serve (pure): each GPU (simulated ones on the CPU), else one CPU device."""
    if machine.gpus:
        simulated = machine.source == "simulated"
        return [
            LentDevice(gpu, None if simulated else gpu.index, config.first_port + i, simulated)
            for i, gpu in enumerate(machine.gpus)
        ]
    size = parse_size(config.cpu_memory) if config.cpu_memory else machine.ram_available_bytes
    cpu = Device(0, "CPU", size, size, (0, 0), kind="cpu")
    return [LentDevice(cpu, None, config.first_port, config.cpu_memory is not None)]


class Server:
    """One device server, kept running until the worker stops."""

    def __init__(self, device: LentDevice, argv: list[str], log_path: Path) -> None:
        self.device = device
        self.argv = argv
        self.log_path = log_path
        self.child: ChildProcess | None = None
        self.exited: asyncio.Task[int] | None = None
        self.running = False
        self.protocol: str | None = None
        self.starts = 0

    def _on_line(self, line: str) -> None:
        self.protocol = self.protocol or LENDER.protocol_version(line)

    async def start(self, host: str) -> None:
        _port_is_free(host, self.device.port)  # else the check below would find the other process listening
        env, inherit = dict(LENDER.env), LENDER.inherit
        self.child = ChildProcess(self.argv, self.log_path, env=env, inherit=inherit, on_line=self._on_line)
        self.starts += 1
        await self.child.start()
        self.exited = asyncio.create_task(self.child.wait(), name=f"{LENDER.server_name} {self.device.port}")
        # Ready once its port accepts. How long that takes depends on how loaded the machine is (a CI
        # runner took more than 15 s for the second of two servers), so the wait is tied to the process
        # being alive rather than to a clock: it ends early only when the process exits.
        started = time.monotonic()
        patience = started + SERVER_START_S
        while time.monotonic() - started < SERVER_START_CEILING_S:
            if self.exited.done():
                break
            if await _accepts(host, self.device.port):
                self.running = True
                log.info(
                    "%s for %s listening on %s:%d", LENDER.server_name, self.device.gpu.name, host, self.device.port
                )
                return
            if patience and time.monotonic() > patience:
                patience = 0.0
                log.info("%s on port %d is alive but not listening yet: waiting", LENDER.server_name, self.device.port)
            await asyncio.sleep(0.1)
        tail = " | ".join(list(self.child.tail)[-3:])
        await self.child.stop(DEVICE_SERVER_STOP_S)
        how = (
            f"exited ({self.exited.result()})"
            if self.exited.done() and not self.exited.cancelled()
            else "never listened"
        )
        raise GatewayError(f"{LENDER.server_name} on {host}:{self.device.port} {how}: {tail or 'no output'}")

    async def stop(self) -> None:
        self.running = False
        if self.child is not None:
            await self.child.stop(DEVICE_SERVER_STOP_S)
        if self.exited is not None:
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await self.exited


def _port_is_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise GatewayError(
                f"port {port} on {host} is taken ({exc.strerror}): pass {LENDER.port_flags[0]} with a free range "
                "(one port per device)"
            ) from exc


async def _accepts(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=1)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


class Worker:
    """This node's servers and its inventory; one task watches the servers and restarts the dead."""

    def __init__(
        self,
        config: WorkerConfig,
        machine: Inventory,
        command: list[str],
        hosted: dict[str, Hosted] | None = None,
        served: dict[str, Served] | None = None,
    ) -> None:
        self.config = config
        self.followers = Followers(hosted or {}, config.log_dir)
        self.replicas = ReplicaServers(served or {}, config.log_dir, config.host)
        self.machine = machine
        self.name = config.name or socket.gethostname()
        self.servers = [
            Server(
                device,
                LENDER.server_argv(
                    command, host=config.host, port=device.port, local_gpu=device.local_gpu, threads=config.threads
                ),
                config.log_dir / f"{LENDER.server_name}-{device.port}.log",
            )
            for device in devices(config, machine)
        ]
        self.build = LENDER.build()
        self._watch: asyncio.Task[None] | None = None
        self._lease: asyncio.Task[None] | None = None
        self._replica_lease: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self) -> None:
        for server in self.servers:  # another process on a port would be taken for our server
            _port_is_free(self.config.host, server.device.port)
        try:
            for server in self.servers:
                await server.start(self.config.host)
        except BaseException:
            await self.stop()
            raise
        self._watch = _kept_task("device servers", self._keep_running)
        self._lease = _kept_task("follower lease", self.followers.keep_lease)
        self._replica_lease = _kept_task("replica leases", self.replicas.keep_lease)

    async def _keep_running(self) -> None:
        """Starts again each device server that exited."""
        while not self._stopping:
            for server in self.servers:
                if server.child is not None and server.exited is not None and server.exited.done():
                    server.running = False
                    code = server.exited.result()
                    log.error(
                        "%s on port %d exited (%s): starting it again", LENDER.server_name, server.device.port, code
                    )
                    await server.child.stop(DEVICE_SERVER_STOP_S)
                    await asyncio.sleep(RESTART_DELAY_S)
                    with contextlib.suppress(GatewayError, OSError):
                        await server.start(self.config.host)
            await asyncio.sleep(0.5)

    async def stop(self) -> None:
        self._stopping = True
        for task in (self._watch, self._lease, self._replica_lease):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.followers.close()
        await self.replicas.close()
        for server in self.servers:
            await server.stop()

    def inventory(self) -> dict[str, Any]:
        """What the head plans with: devices (free memory read now for real GPUs), RAM, build."""
        free = {}
        if self.machine.source == "nvml":
            free = {gpu.index: gpu.free_bytes for gpu in probe_nvml()[0]}
        ram_total, ram_available = host_ram()
        return {
            "node": self.name,
            "build": self.build,
            "protocol": next((s.protocol for s in self.servers if s.protocol), None),
            "source": self.machine.source,
            "ram_total_bytes": ram_total,
            "ram_available_bytes": ram_available,
            # engine groups (vLLM across nodes): the engines this node runs ranks of, with their versions,
            # and the address it serves on (the head sends the one it reached, which may be a name)
            "group_engines": self.followers.engines(),
            # the engines whose whole server it runs for a head (a replica on this node), with their versions
            "replica_engines": self.replicas.engines(),
            "address": self.config.host,
            "devices": [
                server.device.gpu.to_json()
                | {
                    "free_bytes": free.get(server.device.gpu.index, server.device.gpu.free_bytes),
                    "simulated": server.device.simulated,
                    "endpoint": f"{_host_for_url(self.config.host)}:{server.device.port}",
                    "running": server.running,
                    "starts": server.starts,
                }
                for server in self.servers
            ],
        }


def _host_for_url(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


async def _error(request: Request, exc: Exception) -> Response:
    """404/405 (and anything else) as JSON, like the gateway's own routes."""
    return OPENAI.response(as_api_error(exc, request.method, request.url.path))


def create_app(worker: Worker, keys: tuple[str, ...]) -> ASGIApp:
    """The head's side: /health open, everything else behind the keys, checked as ``serve`` checks them
    (:class:`gateway.serving.edge.middleware.ApiKeys`: either header may carry a key). The servers are started by
    :func:`run` before this serves, so that a failed start is one line, not a lifespan traceback."""

    async def health(_request: Request) -> Response:
        return JSONResponse({"status": "ok", "node": worker.name})

    async def inventory_route(_request: Request) -> Response:
        return JSONResponse(worker.inventory())

    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/inventory", inventory_route),
            *_group_routes(worker),
            *_replica_routes(worker),
        ],
        # a start, lease or stop the worker will not do is answered with its own status (400, 409, 413)
        exception_handlers={HTTPException: _error, Refused: _refused, Exception: _error},
    )
    return ApiKeys(app, keys)


def _group_routes(worker: Worker) -> list[Route]:
    """/group: the ranks of an engine over nodes that this worker runs for the head."""

    async def group_state(_request: Request) -> Response:
        return JSONResponse(worker.followers.state())

    async def group_start(request: Request) -> Response:
        return JSONResponse(await worker.followers.start(StartRequest.from_json(await _start_body(request))))

    async def group_lease(_request: Request) -> Response:
        return JSONResponse(worker.followers.renew())

    async def group_stop(_request: Request) -> Response:
        return JSONResponse(await worker.followers.stop())

    return [
        Route("/group", group_state),
        Route("/group/start", group_start, methods=["POST"]),
        Route("/group/lease", group_lease, methods=["POST"]),
        Route("/group/stop", group_stop, methods=["POST"]),
    ]


def _replica_routes(worker: Worker) -> list[Route]:
    """/replica: whole engine servers this worker runs for the head, each one replica."""

    async def replica_states(_request: Request) -> Response:
        return JSONResponse(worker.replicas.all_states())

    async def replica_start(request: Request) -> Response:
        return JSONResponse(await worker.replicas.start(ServerStart.from_json(await _start_body(request))))

    async def replica_lease(request: Request) -> Response:
        name, since = _replica_named(await _start_body(request))
        return JSONResponse(worker.replicas.renew(name, since))

    async def replica_stop(request: Request) -> Response:
        name, _ = _replica_named(await _start_body(request))
        return JSONResponse(await worker.replicas.stop(name))

    return [
        Route("/replica", replica_states),
        Route("/replica/start", replica_start, methods=["POST"]),
        Route("/replica/lease", replica_lease, methods=["POST"]),
        Route("/replica/stop", replica_stop, methods=["POST"]),
    ]


async def _refused(_request: Request, refused: Exception) -> Response:
    assert isinstance(refused, Refused)  # registered for Refused only
    return JSONResponse({"error": {"message": str(refused), "type": "refused"}}, status_code=refused.status)


def _replica_named(body: Any) -> tuple[str, int]:
    """A lease or stop request's replica name and the first log line the head has not read (checked)."""
    name = body.get("replica") if isinstance(body, dict) else None
    if not isinstance(name, str) or not re.fullmatch(REPLICA_NAME, name):
        raise Refused(400, "replica: the name the head started it with")
    since = body.get("since", 0)
    if not isinstance(since, int) or isinstance(since, bool) or since < 0:
        raise Refused(400, "since: the number of the first log line not read yet (0 or more)")
    return name, since


async def _start_body(request: Request) -> Any:
    """The start request's JSON, read within its caps (a 413 past the byte cap, the body never held whole;
    deep nesting and too many arrays refused before they are parsed)."""
    limit, elements = start_request.MAX_BODY_BYTES, start_request.MAX_BODY_ELEMENTS
    try:
        body = await read_body(request, limit)
    except ApiError:
        raise Refused(413, f"a start request is at most {limit} bytes (a head's is a few kB)") from None
    try:
        return parse_object(body, elements)
    except ApiError as refused:
        if refused.status == 413:
            raise Refused(413, f"a start request holds at most {elements} JSON objects and arrays") from None
        raise Refused(400, refused.message.replace("request body", "the start request")) from None


def hosted_here(settings: Settings) -> dict[str, Hosted]:
    """The engines whose ranks this node runs, each with its installation as ``settings`` find it (I/O:
    the engine's command is asked for its version, as ``serve`` asks it)."""
    installations = {name: registry.get(name).installation(settings, probe=True) for name in registry.FOLLOWER_HOSTS}
    return hosted_engines(installations, registry.FOLLOWER_HOSTS)


def served_here(settings: Settings) -> dict[str, Served]:
    """The engines whose whole server this node runs for a head, each with its installation here (I/O)."""
    installations = {name: registry.get(name).installation(settings, probe=True) for name in registry.SERVER_HOSTS}
    return served_engines(installations, registry.SERVER_HOSTS)


def run(config: WorkerConfig) -> int:
    """Serve until SIGINT/SIGTERM; the servers stop with the worker."""
    import uvicorn

    if not config.api_keys:
        raise ConfigError("a worker needs an API key (--api-key KEY or --api-key-file): the head sends it")
    if not all(key.strip() for key in config.api_keys):
        raise ConfigError("an empty --api-key would refuse every request: give a non-empty key")
    for flag, port in (("--port", config.port), (LENDER.port_flags[0], config.first_port)):
        if not 1 <= port <= 65535:
            raise ConfigError(f"{flag} {port} is not a TCP port: give one from 1 to 65535")
    if config.host in ("0.0.0.0", "::"):
        log.warning(
            "%s will listen on every interface with no authentication: anyone who reaches "
            "ports %d+ can use these devices; prefer the address of a private network between the nodes",
            LENDER.server_name,
            config.first_port,
        )
    command = LENDER.command(config.server_command)
    if command is None:
        raise ConfigError(LENDER.missing)
    machine = inventory(config.gpus)
    if machine.source == "simulated":
        machine = replace(
            machine, gpus=tuple(replace(g, name=f"simulated {g.total_bytes / MIB:.0f} MiB (CPU)") for g in machine.gpus)
        )
    hosted = hosted_here(config.engine_settings) if config.engine_settings is not None else {}
    served = served_here(config.engine_settings) if config.engine_settings is not None else {}
    for line in describe(hosted):
        log.info("%s", line)
    for engine in served.values():
        how = " ".join(engine.installation.command) if engine.installation.command else engine.installation.missing
        log.info("%s replicas: %s (%s)", engine.host.title, engine.installation.version, how)
    worker = Worker(config, machine, command, hosted, served)
    for device_server in worker.servers:
        gpu = device_server.device.gpu
        log.info(
            "device %d: %s, %.1f GiB → %s", gpu.index, gpu.name, gpu.total_bytes / GIB, " ".join(device_server.argv)
        )
    app = create_app(worker, config.api_keys)
    uv = uvicorn.Config(
        app, host=config.host, port=config.port, log_level="warning", log_config=None, lifespan="off",
        # the header cap (431) before the key, and short clocks on slow clients: the head's requests are a
        # few hundred bytes, and a worker the head cannot reach is a lost node
        http=bounded_protocol(header_timeout_s=CLIENT_TIMEOUT_S, body_timeout_s=CLIENT_TIMEOUT_S),
    )  # fmt: skip
    server = uvicorn.Server(uv)

    async def serve() -> None:
        await worker.start()  # a failure here is a GatewayError: one line from the CLI, exit 1
        try:
            await server.serve()
        finally:
            await worker.stop()

    log.info("worker %s answering the head on http://%s:%d%s", worker.name, config.host, config.port, "/inventory")
    run_served(server, serve())
    return 0 if server.started else 1
