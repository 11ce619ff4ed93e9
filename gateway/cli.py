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
import shlex
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from gateway.errors import GatewayError

log = logging.getLogger("gateway")


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser("serve", help="start the backend for a model and serve it over HTTP")
    serve.add_argument("--model", help="catalog name or alias, hub repo id, .gguf file or checkpoint directory")
    serve.add_argument("--host", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default 8000)")
    serve.add_argument("--context-length", type=int, dest="context_length", help="context length to serve")
    serve.add_argument("--state-dir", type=Path, dest="state_dir", help="state directory")
    serve.add_argument("--log-dir", type=Path, dest="log_dir", help="backend log directory")
    serve.add_argument("--threads", type=int, help="CPU threads for llama.cpp")
    serve.add_argument("--startup-timeout", type=float, dest="startup_timeout_s", help="seconds an engine may load")
    serve.add_argument("--min-context", type=int, dest="min_context", help="smallest context worth serving")
    serve.add_argument("--vllm-command", type=shlex.split, dest="vllm_command", help="how to start vLLM's server")
    serve.add_argument("--vllm-version", dest="vllm_version", help="plan for this vLLM version")
    serve.add_argument(
        "--llama-cpp-python-command", type=shlex.split, dest="llama_cpp_python_command", help="llama-cpp-python server"
    )
    serve.add_argument(
        "--llama-server-command", type=shlex.split, dest="llama_server_command", help="native llama-server"
    )
    serve.add_argument("--backend-url", dest="backend_url", help="front a server you run (no engine is started)")
    serve.add_argument("--backend-api-key", dest="backend_api_key", help="the key that server expects")
    serve.add_argument(
        "--backend-native-apis", type=lambda v: [p for p in v.split(",") if p], dest="backend_native_apis",
        help="comma list of what that server does itself: responses,messages,include_usage,max_completion_tokens",
    )  # fmt: skip
    serve.add_argument("--backend-max-concurrency", type=int, dest="backend_max_concurrency")
    serve.add_argument("--queue-limit", type=int, dest="queue_limit", help="requests that may wait (429 beyond)")
    serve.add_argument("--queue-wait", type=float, dest="queue_wait_s", help="seconds a request may wait")
    serve.add_argument(
        "--api-key", action="append", dest="api_keys", help="a key clients must send (repeatable); none: open"
    )
    serve.add_argument("--api-key-file", type=Path, dest="api_key_file", help="one accepted key per line")
    serve.add_argument("--log-format", choices=["text", "json"], dest="log_format", help="json: one object per line")
    serve.add_argument("--catalog-dir", type=Path, dest="catalog_dir", help="extra catalog entries (*.toml)")
    serve.add_argument("--replan", action="store_true", default=None, help="ignore the remembered configuration")
    serve.add_argument("--gpu-memory-utilization", type=float, dest="gpu_memory_utilization", help="vLLM: pin")
    serve.add_argument("--kv-cache-memory-bytes", type=int, dest="kv_cache_memory_bytes", help="vLLM: pin")
    serve.add_argument("--max-num-seqs", type=int, dest="max_num_seqs", help="vLLM: pin")
    serve.add_argument("--tensor-parallel-size", type=int, dest="tensor_parallel_size", help="vLLM: pin")
    serve.add_argument("--enforce-eager", action="store_true", default=None, dest="enforce_eager", help="vLLM: pin")
    serve.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], dest="kv_cache_dtype", help="vLLM: pin")
    serve.add_argument("--config", type=Path, help="TOML settings file (default ./gateway.toml)")
    serve.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def _add_plan(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    plan = sub.add_parser(
        "plan",
        help="show whether and how the model fits, term by term, without starting anything",
        description="Flags given explicitly are pinned; the others are chosen by the ladder. "
        "Exit 0 when a candidate fits, 2 when none does, 1 on bad input.",
    )
    plan.add_argument("--model", help="catalog name, hub repo id, .gguf file or checkpoint directory")
    plan.add_argument("--gpus", help="simulate GPUs instead of asking NVML: 2x32GiB, 1x12GiB,1x24GiB, 2x32GiB@12.0")
    plan.add_argument("--ram", help="host RAM to plan with, e.g. 64GiB (default: what is available)")
    plan.add_argument("--backend", choices=["vllm", "llamacpp"], help="plan only this engine")
    plan.add_argument("--launcher", choices=["python", "native"], default="python", help="llama.cpp server")
    plan.add_argument("--vllm-version", help="plan for this vLLM release (default: installed, else assumed)")
    plan.add_argument("--tensor-parallel-size", type=int)
    plan.add_argument("--gpu-memory-utilization", type=float)
    plan.add_argument("--max-model-len", type=int)
    plan.add_argument("--max-num-seqs", type=int)
    plan.add_argument("--max-num-batched-tokens", type=int)
    plan.add_argument("--kv-cache-dtype", choices=["auto", "fp8"])
    plan.add_argument("--kv-cache-memory-bytes", type=int)
    plan.add_argument("--enforce-eager", action="store_true", default=None)
    plan.add_argument("--cpu-offload-gb", type=float)
    plan.add_argument("--allow-cpu-offload", action="store_true", help="let the ladder use --cpu-offload-gb")
    plan.add_argument("--min-context", type=int, default=32768, help="smallest acceptable context (default 32768)")
    plan.add_argument("--max-context", type=int, help="longest context worth reserving")
    plan.add_argument("--json", action="store_true", help="one JSON object")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    models = sub.add_parser("models", help="list the model catalog")
    models.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health poll is noise


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
    from gateway.proxy import Upstream
    from gateway.settings import load_settings
    from gateway.startup import decide
    from gateway.lifecycle import State
    from gateway.supervisor import Supervisor

    overrides: dict[str, Any] = {key: getattr(args, key, None) for key in _SERVE_SETTINGS}
    settings = load_settings(overrides, args.config)
    if settings.log_format == "json":
        _json_logging()
    upstream = Upstream(connect_timeout_s=settings.connect_timeout_s, read_timeout_s=settings.request_timeout_s)
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
            shutdown_grace_s=settings.shutdown_grace_s,
            remember=decision.remember,
            plan_summary={
                "decision": plan.decision_reason,
                "engine_version": f"vllm {plan.vllm_version} ({plan.vllm_version_source})",
                "notes": plan.notes,
            },
        )
        for number, option in enumerate(decision.options, 1):
            log.info("option %d of %d: %s", number, len(decision.options), option.label)
        runtime = _runtime(settings, decision.route, supervisor, upstream, **_plan_figures(plan))
        fronted = decision.route.fronted
    sock = _bind(settings.host, settings.port)
    config = uvicorn.Config(
        create_app(runtime),
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
        lifespan="on",
    )
    server = uvicorn.Server(config)

    def give_up() -> None:
        server.should_exit = True

    runtime.on_startup_failure = give_up
    shown_host = "localhost" if settings.host in ("127.0.0.1", "0.0.0.0", "::") else settings.host
    log.info("serving %s at http://%s:%d/v1 once an engine is ready", fronted, shown_host, settings.port)

    # uvicorn handles SIGINT/SIGTERM while serving and re-raises them once it has shut down; these
    # handlers receive that re-raise (and any signal before uvicorn takes over) so that a requested
    # stop, completed cleanly, exits 0 instead of dying by the signal.
    def stop_requested(_signum: int, _frame: object) -> None:
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop_requested) for sig in (signal.SIGINT, signal.SIGTERM)}
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


def _plan_figures(plan: Any) -> dict[str, Any]:
    """What /metrics and the status page show of the plan: the chosen candidate's memory per GPU."""
    from gateway.metrics import live_gpu_memory

    figures: dict[str, Any] = {"plan_details": {"candidates": [c.to_json() for c in plan.candidates]}}
    chosen = plan.chosen
    if chosen is not None and hasattr(chosen, "memory"):
        memory = chosen.memory
        terms = {"weights": memory.weights, "activation": memory.activation, "cudagraph": memory.cudagraph}
        terms["kv_cache"] = max(memory.kv_cache, 0)
        figures["plan_memory"] = [
            (gpu, term, value) for gpu in range(chosen.flags.tensor_parallel_size) for term, value in terms.items()
        ]
        figures["plan_kv_tokens"] = memory.kv_tokens
    elif chosen is not None:
        p = chosen.placement
        figures["plan_memory"] = [
            (i, term, value)
            for i in range(len(p.device_model))
            for term, value in (
                ("model", p.device_model[i]),
                ("kv_cache", p.device_kv[i]),
                ("compute", p.device_compute[i]),
            )
        ]
    if plan.inventory.gpus:
        figures["gpu_memory"] = live_gpu_memory
    return figures


def _json_logging() -> None:
    """One JSON object per log line (time, level, logger, message, request_id) for log collectors."""
    from gateway.edge import request_id

    class JsonFormatter(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            entry = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name}
            entry["message"] = record.getMessage()
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
    """`--backend-url`: the served name and context come from the server's own /v1/models."""
    import httpx

    from backends.base import Launch
    from gateway.errors import ConfigError
    from gateway.external import ExternalBackend
    from gateway.routing import ModelRoute

    url = settings.backend_url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {settings.backend_api_key}"} if settings.backend_api_key else {}
    served, context = settings.model, settings.context_length or 0
    try:
        cards = httpx.get(url + "/v1/models", headers=headers, timeout=10, trust_env=False).json().get("data") or []
    except (httpx.HTTPError, ValueError) as exc:
        if not settings.model:
            raise ConfigError(
                f"cannot read {url}/v1/models ({type(exc).__name__}): start that server or pass --model"
            ) from exc
        cards = []
    if cards:
        served = cards[0].get("id", served)
        context = context or int(cards[0].get("max_model_len") or (cards[0].get("meta") or {}).get("n_ctx_train") or 0)
    if not served:
        raise ConfigError(f"{url}/v1/models lists no model: pass --model with the name it serves")
    launch = Launch(
        engine="external",
        argv=[],
        port=0,
        api_key=settings.backend_api_key or "",
        served_name=served,
        context_length=context,
        health_path="/v1/models",
        summary=f"the server at {url}",
        max_concurrency=settings.backend_max_concurrency,
        native=frozenset(settings.backend_native_apis),
        base=url,
    )
    backend = ExternalBackend(launch)
    route = ModelRoute(fronted=settings.model or served, served=served, context_length=context)
    return _runtime(settings, route, backend, upstream)


def _runtime(settings: Any, route: Any, backend: Any, upstream: Any, **plan_figures: Any) -> Any:
    """The app's runtime: what the settings decide about limits and keys, for either kind of backend."""
    from gateway.app import Runtime

    return Runtime(
        route=route,
        supervisor=backend,
        upstream=upstream,
        max_body_bytes=settings.max_body_bytes,
        queue_limit=settings.queue_limit,
        queue_wait_s=settings.queue_wait_s,
        api_keys=settings.all_api_keys(),
        **plan_figures,
    )


_SERVE_SETTINGS = (
    "model", "host", "port", "context_length", "state_dir", "log_dir", "threads", "startup_timeout_s",
    "min_context", "vllm_command", "vllm_version", "llama_cpp_python_command", "llama_server_command",
    "catalog_dir", "replan", "backend_url", "backend_api_key", "backend_native_apis", "backend_max_concurrency",
    "queue_limit", "queue_wait_s", "api_keys", "api_key_file", "log_format",
    "gpu_memory_utilization", "kv_cache_memory_bytes", "max_num_seqs", "tensor_parallel_size",
    "enforce_eager", "kv_cache_dtype",
)  # fmt: skip


_PINNABLE = (
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "kv_cache_dtype",
    "kv_cache_memory_bytes",
    "enforce_eager",
    "cpu_offload_gb",
)


def plan_command(args: argparse.Namespace) -> int:
    from gateway.catalog import DEFAULT_MODEL, builtin_catalog
    from gateway.hardware import inventory
    from gateway.plan_report import render
    from gateway.planner import Policy, plan

    machine = inventory(args.gpus, args.ram)
    entry = builtin_catalog().resolve(args.model or DEFAULT_MODEL)
    pinned = {name: getattr(args, name) for name in _PINNABLE if getattr(args, name) is not None}
    policy = Policy(
        min_context=args.min_context,
        max_context=args.max_context,
        allow_cpu_offload=args.allow_cpu_offload,
        backend=args.backend,
        launcher=args.launcher,
        vllm_version=args.vllm_version,
        pinned=pinned,
    )
    result = plan(entry, machine, policy)
    if not result.candidates:  # nothing could even be evaluated: the model's facts are out of reach
        raise GatewayError("; ".join(result.notes) or f"no engine can be planned for {entry.name}")
    print(json.dumps(result.to_json(), indent=2) if args.json else render(result))
    return 0 if result.chosen is not None else 2


def list_models(args: argparse.Namespace) -> int:
    from gateway.catalog import builtin_catalog

    entries = builtin_catalog().entries
    if args.json:
        print(json.dumps([entry.model_dump(mode="json") for entry in entries], indent=2))
        return 0
    for entry in entries:
        engines = "+".join(name for name in ("vllm", "llamacpp") if getattr(entry, name) is not None)
        aliases = f"  (aliases: {', '.join(entry.aliases)})" if entry.aliases else ""
        print(f"{entry.name:<20} {engines:<14} {entry.description}{aliases}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    _configure_logging(getattr(args, "verbose", False))
    try:
        if args.command == "serve":
            return serve(args)
        if args.command == "plan":
            return plan_command(args)
        if args.command == "gpus":
            return gpus_command(args)
        return list_models(args)
    except GatewayError as exc:
        print(f"gateway: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
