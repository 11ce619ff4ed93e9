"""How llama.cpp's two launchers are started: the configuration, each one's argv and its ``Launch``.

Both serve one GGUF on 127.0.0.1 with a key; they differ in flag names and in what the server does
itself (llama-server parses tool calls from the GGUF's Jinja template, reports its slots' progress,
drafts, keeps sessions warm). The one place their flag names live; what else differs between them is
a field of the launcher (:mod:`gateway.backends.llamacpp.launcher`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

from gateway.backends.base import Launch
from gateway.backends.llamacpp.drafting import ARGV as DRAFT_ARGV
from gateway.backends.llamacpp.kv_cache import KV_TYPES
from gateway.backends.llamacpp.ladder import LlamaCppCandidate
from gateway.backends.llamacpp.launcher import NATIVE, PYTHON, Launcher
from gateway.backends.llamacpp.logs import memory_line, speed_line
from gateway.backends.llamacpp.progress import SLOTS_PATH, slots_progress
from gateway.backends.llamacpp.rpc import rpc_arguments
from gateway.backends.llamacpp.scheduling import Batch, batch, scheduling
from gateway.backends.llamacpp.warm_sessions import WarmSessions
from gateway.backends.sampling import Sampling

# ggml's own variables (GGML_CUDA_*, GGML_SCHED_*...) reach the engine; LLAMA_ARG_* do not: the plan sets its flags
INHERITED_ENV = ("GGML_",)

ENGINE = "llamacpp"
DISTRIBUTION = "llama-cpp-python"


@dataclass(frozen=True)
class LlamaCppConfig:
    """What to run: the GGUF, the name to serve it under, and where the plan put it."""

    gguf: Path
    served_name: str
    context_length: int
    chat_format: str | None = None
    gpu_layers: int = 0
    tensor_split: tuple[float, ...] = ()
    kv_type: str = "f16"
    threads: int | None = None
    launcher: Launcher = PYTHON
    n_cpu_moe: int = 0  # native only: blocks whose MoE experts stay in RAM
    rpc: tuple[str, ...] = ()  # native only: other nodes' ggml-rpc-servers ("host:port"), first in -ts order
    reasoning_format: str | None = None  # native only: how thinking is split out of content (deepseek)
    draft: str | None = None  # native only: self-drafting speculative decoding, "mtp" or "ngram"
    warm: WarmSessions | None = None  # native only: KV room, prompt cache, checkpoints, as the plan sized them
    sampling: Sampling | None = None  # the model's recommended sampling: the server's defaults for every request


# the recommended sampling's fields → llama-server's flags (common/arg.cpp of build 11434), and llama-cpp-python's
# request fields (llama_cpp/server/types.py: it has no server-wide sampling defaults, only per request)
SAMPLING_FLAGS = {
    "temperature": "--temp",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "min_p": "--min-p",
    "repetition_penalty": "--repeat-penalty",
    "presence_penalty": "--presence-penalty",
    "frequency_penalty": "--frequency-penalty",
}
SAMPLING_ALIASES = {"--temperature": "--temp"}  # the same flag's other names
PYTHON_REQUEST_FIELDS = {"repetition_penalty": "repeat_penalty"}  # the others are named alike


def sampling_argv(sampling: Sampling | None, given: list[str] | tuple[str, ...] = ()) -> list[str]:
    """llama-server's default sampling from the model's recommendation: every field set, those the
    authors leave unsaid off as vLLM leaves them (so llama.cpp's own top_k 40, min_p 0.05 and temperature
    0.8 do not sample it differently from vLLM); nothing when nothing is recommended. A flag the user's
    own llama-server command (``given``) sets is left to it (a later flag would win over it)."""
    if sampling is None or not sampling.recommends:
        return []
    taken = {SAMPLING_ALIASES.get(flag, flag) for word in given if (flag := word.split("=")[0])}
    chosen = {SAMPLING_FLAGS[name]: value for name, value in sampling.complete().items()}
    return [word for flag, value in chosen.items() if flag not in taken for word in (flag, f"{value:g}")]


def sampling_fields(sampling: Sampling | None) -> dict[str, float]:
    """The same defaults as llama-cpp-python's request fields, which the gateway adds to a request
    that does not set them (its server takes no defaults of its own)."""
    if sampling is None or not sampling.recommends:
        return {}
    return {PYTHON_REQUEST_FIELDS.get(name, name): value for name, value in sampling.complete().items()}


def installed_version() -> str | None:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def python_command() -> list[str] | None:
    """This interpreter running llama-cpp-python's server module, if the package is installed here."""
    return [sys.executable, "-m", "llama_cpp.server"] if importlib.util.find_spec("llama_cpp") else None


def server_argv(config: LlamaCppConfig, *, command: list[str], port: str) -> list[str]:
    """llama-cpp-python's server argv; the one place its flag names live."""
    argv = [
        *command,
        "--model", str(config.gguf),
        "--model_alias", config.served_name,
        "--n_ctx", str(config.context_length),
        "--n_gpu_layers", str(config.gpu_layers),
        # logits for every position would allocate n_ctx x vocab floats (32 GiB for Gemma at 32k)
        "--logits_all", "False",
    ]  # fmt: skip
    if len(config.tensor_split) > 1:
        argv += ["--tensor_split", *(f"{share:g}" for share in config.tensor_split)]
    if config.kv_type != "f16":
        type_id = str(KV_TYPES[config.kv_type][1])
        argv += ["--type_k", type_id, "--type_v", type_id]
    if config.kv_type != "f16" or config.gpu_layers:  # quantized V needs it; GPUs want it (see compute)
        argv += ["--flash_attn", "True"]
    if config.threads:
        argv += ["--n_threads", str(config.threads)]
    if config.chat_format:
        argv += ["--chat_format", config.chat_format]
    return [*argv, "--host", "127.0.0.1", "--port", port]  # the key comes in the environment


def native_argv(config: LlamaCppConfig, *, command: list[str], port: str) -> list[str]:
    """llama-server's argv: placement given explicitly, so its own --fit stands aside. ``-c`` is the
    unified cache's cells (the context and the plan's room for sessions kept warm),
    ``--kv-unified-per-slot`` one request's context: the engine caps each slot there and answers a
    longer prompt with its own context-size error (backends.llamacpp.warm_sessions)."""
    cells = config.context_length + (config.warm.room_cells if config.warm else 0)
    argv = [*command, "-m", str(config.gguf), "--alias", config.served_name, "-c", str(cells)]
    argv += ["--kv-unified-per-slot", str(config.context_length)]
    argv += ["-ngl", str(config.gpu_layers), *rpc_arguments(config.rpc)]
    if len(config.tensor_split) > 1:
        argv += ["-ts", ",".join(f"{share:g}" for share in config.tensor_split)]
    if config.n_cpu_moe:
        argv += ["--n-cpu-moe", str(config.n_cpu_moe)]
    if config.kv_type != "f16":
        argv += ["-ctk", config.kv_type, "-ctv", config.kv_type]
    if config.threads:
        argv += ["-t", str(config.threads)]
    step = plan_batch(config, command)
    argv += step.argv  # -b 64 on the CPU, 512 on one GPU (scheduling.py)
    # the GGUF's own Jinja template (tool calls parsed from it); a catalog's chat_format names one of
    # llama.cpp's built-in templates instead, which only applies with Jinja off
    argv += ["--no-jinja", "--chat-template", config.chat_format] if config.chat_format else ["--jinja"]
    if config.reasoning_format and not config.chat_format:  # <think>…</think> into reasoning_content
        argv += ["--reasoning-format", config.reasoning_format]
    if config.draft:  # bounded so that every slot's draft fits one step (drafting.step_bound)
        argv += [*DRAFT_ARGV[config.draft], *step.draft_argv]
    argv += sampling_argv(config.sampling, given=command)  # a request's own fields still win
    if config.warm is not None:  # without it (a config made by hand) llama-server's own defaults stand
        argv += config.warm.argv()
    # slots share one unified KV cache (with -np alone each slot would get only -c / slots); -lv 4
    # logs each device's model/KV/compute buffers (read back into /status), hidden by default
    argv += ["-np", str(NATIVE.slots), "--kv-unified", "-fa", "on", "--fit", "off", "-lv", "4"]
    return [*argv, "--host", "127.0.0.1", "--port", port]  # the key comes in the environment


def plan_batch(config: LlamaCppConfig, command: list[str]) -> Batch:
    """The batch size for many sessions where the config runs: on the CPU (no layer on a GPU, no RPC
    device), one device, or several (``-ts``); and the draft's bound in such a step."""
    on_cpu = config.gpu_layers == 0 and not config.rpc
    return batch(len(config.tensor_split), on_cpu=on_cpu, given=command, draft=config.draft)


def split_phrase(tensor_split: tuple[float, ...], rpc: tuple[str, ...] = ()) -> str:
    """The summary's ", split 10,11" when layers are split over several devices (", 2 over RPC"
    when the first of them are other nodes' devices)."""
    split = f", split {','.join(f'{share:g}' for share in tensor_split)}" if len(tensor_split) > 1 else ""
    return split + (f" ({len(rpc)} over RPC: {','.join(rpc)})" if rpc else "")


def build_launch(config: LlamaCppConfig, *, port: int, api_key: str, command: list[str]) -> Launch:
    """The start of ``config``'s launcher, its key in the environment (never on argv: any local user
    can read /proc/PID/cmdline)."""
    return _LAUNCH[config.launcher](config, port, api_key, command)


def _native_launch(config: LlamaCppConfig, port: int, api_key: str, command: list[str]) -> Launch:
    launcher = config.launcher
    argv = native_argv(config, command=command, port=str(port))
    split = split_phrase(config.tensor_split, config.rpc)
    experts = f", experts of {config.n_cpu_moe} layers in RAM" if config.n_cpu_moe else ""
    draft = f", drafting {config.draft}" if config.draft else ""
    summary = (
        f"llama.cpp (llama-server), {config.gguf.name}, context {config.context_length}, KV {config.kv_type}, "
        f"{config.gpu_layers} GPU layers{split}{experts}{draft}"
    )
    return Launch(
        ENGINE,
        argv,
        port,
        api_key,
        config.served_name,
        config.context_length,
        launcher.health_path,
        summary,
        native=launcher.native_apis,
        reasoning_field="reasoning_content",
        tokenize_path="/tokenize",
        tokenize_key="content",
        template_path="/apply-template",
        memory_line=memory_line,
        speed_line=speed_line,
        max_concurrency=launcher.slots,
        scheduling=scheduling(launcher.slots, plan_batch(config, command).why),
        progress_path=SLOTS_PATH,
        progress=slots_progress,
        env={launcher.key_variable: api_key},
        inherit=INHERITED_ENV,
    )


def _python_launch(config: LlamaCppConfig, port: int, api_key: str, command: list[str]) -> Launch:
    launcher = config.launcher
    argv = server_argv(config, command=command, port=str(port))
    version = installed_version()
    split = split_phrase(config.tensor_split)
    summary = (
        f"llama.cpp (llama-cpp-python {version or 'unknown version'}), {config.gguf.name}, "
        f"context {config.context_length}, KV {config.kv_type}, {config.gpu_layers} GPU layers{split}"
    )
    return Launch(
        engine=ENGINE,
        argv=argv,
        port=port,
        api_key=api_key,
        served_name=config.served_name,
        context_length=config.context_length,
        health_path=launcher.health_path,
        summary=summary,
        native=launcher.native_apis,
        tokenize_path="/extras/tokenize/count",
        memory_line=memory_line,
        speed_line=speed_line,
        env={launcher.key_variable: api_key},
        inherit=INHERITED_ENV,
        request_defaults=sampling_fields(config.sampling),  # its server has no sampling flags
    )


# each launcher's argv and start (the one thing its value cannot hold: they are built from the config)
_ARGV = {NATIVE: native_argv, PYTHON: server_argv}
_LAUNCH = {NATIVE: _native_launch, PYTHON: _python_launch}


def plan_argv(
    candidate: LlamaCppCandidate,
    *,
    served_name: str,
    gguf: str,
    command: list[str] | None = None,
    chat_format: str | None = None,
    rpc: tuple[str, ...] = (),
    reasoning_format: str | None = None,
    sampling: Sampling | None = None,
) -> list[str]:
    """argv for the candidate's launcher, with PORT/KEY placeholders that `serve` fills in."""
    p, launcher = candidate.placement, candidate.launcher
    config = LlamaCppConfig(
        gguf=Path(gguf),
        served_name=served_name,
        context_length=candidate.n_ctx,
        chat_format=chat_format,
        gpu_layers=p.n_gpu_layers,
        tensor_split=p.tensor_split,
        kv_type=candidate.kv_type,
        launcher=launcher,
        n_cpu_moe=p.n_cpu_moe,
        rpc=rpc if launcher.over_rpc else (),
        reasoning_format=reasoning_format,
        draft=candidate.draft if launcher.drafts else None,
        warm=candidate.warm if launcher.keeps_warm else None,
        sampling=sampling,
    )
    return _ARGV[launcher](config, command=command or list(launcher.shown_command), port="PORT")
