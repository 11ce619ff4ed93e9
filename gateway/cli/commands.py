"""``gateway``: thin commands over library calls.

Examples::

    gateway serve                         # embedded default model on a machine without GPUs
    gateway serve --model glm-4.7-flash --host 0.0.0.0 --port 8000
    gateway serve --model ./my-model-Q4_K_M.gguf --context-length 16384
    gateway models                        # what the catalog knows
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import typing
from pathlib import Path
from typing import Any

from gateway.backends.registry import FOLLOWER_HOSTS
from gateway.cli.flags import add_setting_flags, given
from gateway.cli.full_settings import ENGINE_SETTINGS, SETTING_NAMES, load_settings
from gateway.cli.log_setup import configure_logging, use_json_lines
from gateway.core.errors import GatewayError
from gateway.serving.edge.listen import bind_listener

log = logging.getLogger("gateway")

# Settings each command exposes as flags (declared once: gateway/core/settings.py and each engine's own).
SERVE_SETTINGS = SETTING_NAMES
PLAN_SETTINGS = (
    "model", "catalog_dir", "context_length", "min_context", "target_context", "max_context", "engine", "port",
    "workers", "worker_api_key", "state_dir", "gpus", "ram", "sessions", "replicas", *ENGINE_SETTINGS,
)  # fmt: skip
# ... and where each engine that runs ranks of a head's group is (vllm_command, vllm_version)
_FOLLOWER_SETTINGS = tuple(n for n in ENGINE_SETTINGS if n.startswith(tuple(f"{e}_" for e in FOLLOWER_HOSTS)))
WORKER_SETTINGS = ("api_keys", "api_key_file", "threads", "state_dir", "log_dir", "gpus", *_FOLLOWER_SETTINGS)


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
    plan.add_argument(
        "--remote-gpus", help="simulate other nodes' devices instead of asking workers: node2=2x24GiB;node3=1x12GiB"
    )
    plan.add_argument("--config", type=Path, help="TOML settings file (default ./gateway.toml)")
    plan.add_argument("--json", action="store_true", help="one JSON object")
    plan.add_argument("-v", "--verbose", action="store_true", help="every rung of every engine's ladder")


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on bad arguments, which `gateway plan` uses for "nothing fits": bad input of
    any kind exits 1 (the subcommands' parsers are of this class too)."""

    def error(self, message: str) -> typing.NoReturn:
        self.print_usage(sys.stderr)
        self.exit(1, f"gateway: error: {message}\n")


def _add_worker(sub: argparse._SubParsersAction[Any]) -> None:
    from gateway.backends.registry import LENDER

    server = LENDER.server_name
    worker = sub.add_parser(
        "worker",
        help=f"lend this node's GPUs to a head (one {server} per GPU)",
        description=f"Starts one {server} per GPU (one for the CPU without GPUs) on --host and answers "
        "the head (`gateway serve --workers THIS_HOST:PORT`) with its inventory; the API key is required. "
        f"{server} has no authentication: keep --host on a private network between the nodes. "
        "Example: gateway worker --host 10.0.0.2 --api-key SECRET",
    )
    worker.add_argument("--host", default="127.0.0.1", help="address to bind the servers and the HTTP side to")
    worker.add_argument("--port", type=int, default=50100, help="the HTTP side the head asks (default 50100)")
    worker.add_argument(
        *LENDER.port_flags, dest="device_port", type=int, default=LENDER.default_port,
        help=f"first {server} port (one per device; default {LENDER.default_port})",
    )  # fmt: skip
    worker.add_argument("--name", default="", help="this node's name in the head's plan (default: host name)")
    worker.add_argument("--cpu-memory", help="without GPUs: the CPU device's size to report (default: RAM available)")
    worker.add_argument(*LENDER.command_flags, dest="server_command", help=f"the {server} to run (default: installed)")
    add_setting_flags(worker, WORKER_SETTINGS)
    for action in worker._actions:
        if action.dest == "api_keys":  # required here, unlike serve's
            action.help = "key the head must send (Bearer or x-api-key; the flag repeats); at least one is required"
    worker.add_argument("--config", type=Path, help="TOML settings file (default ./gateway.toml)")


def worker_command(args: argparse.Namespace) -> int:
    import shlex

    from gateway.nodes.worker import WorkerConfig, run

    settings = load_settings(given(args, WORKER_SETTINGS), args.config)
    config = WorkerConfig(
        host=args.host,
        port=args.port,
        first_port=args.device_port,
        name=args.name,
        gpus=settings.gpus,
        cpu_memory=args.cpu_memory,
        threads=settings.threads,
        api_keys=settings.read_api_keys(),
        server_command=tuple(shlex.split(args.server_command)) if args.server_command else None,
        log_dir=settings.backend_log_dir,
        engine_settings=settings,
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
    add_setting_flags(gpus, ("gpus", "ram"))
    gpus.add_argument("--config", type=Path, help="TOML settings file (default ./gateway.toml)")
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


def serve(args: argparse.Namespace) -> int:
    """Assemble the gateway (gateway.cli.startup.assemble) and serve it until a stop is asked for."""
    import uvicorn

    from gateway.cli.startup import assemble
    from gateway.serving.app import create_app
    from gateway.serving.drain import DrainingServer
    from gateway.serving.edge.http_limits import bounded_protocol, connection_cap
    from gateway.serving.edge.run_served import run_served
    from gateway.supervision.lifecycle import State

    settings = load_settings(given(args, SERVE_SETTINGS), args.config)
    if settings.log_format == "json":
        use_json_lines()
    served = assemble(settings)
    runtime, supervisor, fronted = served.runtime, served.supervisor or served.replicas, served.fronted
    sock = bind_listener(settings.host, settings.port)
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

    def stop_requested(signum: int) -> None:
        if signum == signal.SIGHUP and not server.should_exit:
            log.info("SIGHUP: stopping (requests in flight get shutdown_grace_s)")

    try:
        run_served(server, server.serve(sockets=[sock]), on_stop=stop_requested)
    finally:
        sock.close()
    if supervisor is None or supervisor.ever_ready or supervisor.state is not State.FAILED:
        return 0  # served, or stopped on request before an engine was up
    print(f"gateway: could not start {fronted}: {supervisor.report()}", file=sys.stderr)
    return 1


def gpus_command(args: argparse.Namespace) -> int:
    """The inventory as the planner sees it."""
    from gateway.core.devices import GIB, inventory

    settings = load_settings(given(args, ("gpus", "ram")), args.config)
    machine = inventory(settings.gpus, settings.ram)
    if args.json:
        print(json.dumps(machine.to_json(), indent=2))
        return 0
    for note in machine.notes:
        print(note)
    for g in machine.gpus:
        sizes = f"{g.total_bytes / GIB:.1f} GiB total, {g.free_bytes / GIB:.1f} GiB free"
        print(f"GPU{g.index} {g.name}: {sizes}, cc {g.capability}")
    if len(machine.gpus) > 1:
        print(f"peer-to-peer between all GPUs: {'yes' if machine.peer_to_peer else 'no'}")
    print(f"RAM: {machine.ram_total_bytes / GIB:.1f} GiB total, {machine.ram_available_bytes / GIB:.1f} GiB available")
    return 0


def plan_command(args: argparse.Namespace) -> int:
    from gateway.core.devices import inventory
    from gateway.nodes.pooled import with_other_nodes
    from gateway.planning.catalog import DEFAULT_MODEL, catalog_with
    from gateway.planning.from_settings import plan_for
    from gateway.planning.plan_report import render, to_json

    settings = load_settings(given(args, PLAN_SETTINGS), args.config)
    machine = with_other_nodes(inventory(settings.gpus, settings.ram), settings, args.remote_gpus)
    entry = catalog_with(settings.catalog_dir).resolve(settings.model or DEFAULT_MODEL)
    result = plan_for(settings, entry, machine, serving=False)
    if not result.candidates:  # nothing could even be evaluated: the model's facts are out of reach
        raise GatewayError("; ".join(result.notes) or f"no engine can be planned for {entry.name}")
    if args.json:
        text = json.dumps(to_json(result, settings.port), indent=2)
    else:
        text = render(result, settings.port, verbose=args.verbose)
    print(text)
    return 0 if result.chosen is not None else 2


def agent_command(args: argparse.Namespace) -> int:
    from gateway.agents import AGENTS, ask, write

    config = AGENTS[args.name](ask(args.url, args.api_key))
    if args.write:
        return write(args.name, config, yes=args.yes)
    print(f"# {args.name}: {_one_line(config.where)}", file=sys.stderr)
    for note in config.notes:
        print(f"# {_one_line(note)}", file=sys.stderr)
    print(config.text, end="")
    return 0


def _one_line(text: str) -> str:
    """A ``#`` note as one printable line: the model id in it is what the gateway's /v1/models said, and
    a newline in it began a line of the user's shell paste (an ANSI escape reached the terminal)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def list_models(args: argparse.Namespace) -> int:
    from gateway.planning.catalog import builtin_catalog

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
    configure_logging(getattr(args, "verbose", False))
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
