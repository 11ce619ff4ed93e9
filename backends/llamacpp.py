"""llama.cpp through llama-cpp-python's OpenAI-compatible server: argv, health, log classifier.

The server runs as a child process (``python -m llama_cpp.server``); the gateway never imports
llama_cpp. Flag names are the server's pydantic settings (``--n_ctx``, ``--n_gpu_layers``...).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from backends.base import Failure, FailureKind, Launch, first_failure
from gateway.errors import BackendError
from gateway.hardware import GIB, MIB, Gpu
from gateway.modelfacts import ModelFacts

ENGINE = "llamacpp"
DISTRIBUTION = "llama-cpp-python"
# /v1/models answers once the model is loaded (the server loads it before it binds the port).
HEALTH_PATH = "/v1/models"
NATIVE_HEALTH_PATH = "/health"  # llama-server answers 200 once the model is loaded
# Without a planner (CPU), serve at most this much context: long prompts are slow on a CPU anyway.
CPU_CONTEXT_CAP = 32768
FALLBACK_CONTEXT = 4096  # when neither the catalog nor the GGUF header says


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
    launcher: str = "python"  # "python": llama-cpp-python's server; "native": llama-server
    n_cpu_moe: int = 0  # native only: blocks whose MoE experts stay in RAM


def installed_version() -> str | None:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def default_command() -> list[str]:
    """This interpreter running the server module, after checking (without importing) that it exists."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise BackendError(
            "llama-cpp-python is not installed in this environment: pip install 'gateway[llamacpp]' "
            "(or set llama_cpp_python_command to a Python that has it)"
        )
    return [sys.executable, "-m", "llama_cpp.server"]


def server_argv(config: LlamaCppConfig, *, command: list[str], port: str, api_key: str) -> list[str]:
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
    return [*argv, "--host", "127.0.0.1", "--port", port, "--api_key", api_key]


def native_argv(config: LlamaCppConfig, *, command: list[str], port: str, api_key: str) -> list[str]:
    """llama-server's argv: placement given explicitly, so its own --fit stands aside."""
    argv = [*command, "-m", str(config.gguf), "--alias", config.served_name, "-c", str(config.context_length)]
    argv += ["-ngl", str(config.gpu_layers)]
    if len(config.tensor_split) > 1:
        argv += ["-ts", ",".join(f"{share:g}" for share in config.tensor_split)]
    if config.n_cpu_moe:
        argv += ["--n-cpu-moe", str(config.n_cpu_moe)]
    if config.kv_type != "f16":
        argv += ["-ctk", config.kv_type, "-ctv", config.kv_type]
    if config.threads:
        argv += ["-t", str(config.threads)]
    argv += ["-fa", "on", "--fit", "off", "--jinja"]
    return [*argv, "--host", "127.0.0.1", "--port", port, "--api-key", api_key]


def build_launch(config: LlamaCppConfig, *, port: int, api_key: str, command: list[str]) -> Launch:
    if config.launcher == "native":
        argv = native_argv(config, command=command, port=str(port), api_key=api_key)
        summary = (
            f"llama.cpp (llama-server), {config.gguf.name}, context {config.context_length}, KV {config.kv_type}, "
            f"{config.gpu_layers} GPU layers, experts of {config.n_cpu_moe} layers in RAM"
        )
        return Launch(
            ENGINE,
            argv,
            port,
            api_key,
            config.served_name,
            config.context_length,
            NATIVE_HEALTH_PATH,
            summary,
            native=frozenset({"responses", "messages", "include_usage", "max_completion_tokens", "openai_shapes"}),
            reasoning_field="reasoning_content",
            tokenize_path="/tokenize",
            tokenize_key="content",
        )
    argv = server_argv(config, command=command, port=str(port), api_key=api_key)
    version = installed_version()
    split = f", split {','.join(f'{s:g}' for s in config.tensor_split)}" if len(config.tensor_split) > 1 else ""
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
        health_path=HEALTH_PATH,
        summary=summary,
        tokenize_path="/extras/tokenize/count",  # llama-cpp-python serves no Responses/Messages, no usage chunk
    )


_PATTERNS: list[tuple[re.Pattern[str], FailureKind, str]] = [
    (
        re.compile(
            r"Model path does not exist|invalid magic characters|failed to read key-value pairs"
            r"|not within the file bounds|Failed to load model from file|error loading model|failed to load model"
        ),
        FailureKind.MODEL_FILE,
        "the GGUF file is missing, truncated or not GGUF: re-download it",
    ),
    (
        re.compile(
            r"failed to allocate buffer|Failed to create llama_context|Unable to allocate|"
            r"cannot allocate|out of memory",
            re.IGNORECASE,
        ),
        FailureKind.OUT_OF_MEMORY,
        "not enough memory for this context: lower --context-length",
    ),
    (
        re.compile(r"address already in use|couldn't bind HTTP server socket"),
        FailureKind.PORT_IN_USE,
        "the backend's port was taken by another process: start again",
    ),
    (
        re.compile(r"error: argument|unrecognized arguments|Input should be"),
        FailureKind.BAD_ARGUMENT,
        "llama-cpp-python rejected an argument: check llama_cpp_python_command and its version",
    ),
]


def classify(line: str) -> Failure | None:
    """The failure this log line proves, if any."""
    return first_failure(_PATTERNS, line)


# ---------------------------------------------------------------------------------------------
# Planning: where llama.cpp puts each layer, and what that costs per device and in host RAM.
# Layer placement follows llama_model::load_tensors: `-ngl N` offloads the last N slots (blocks, then
# the output layer as one more slot); the token embedding stays on the CPU; offloaded slots are
# split across GPUs by cumulative --tensor-split fractions.
# ---------------------------------------------------------------------------------------------

KV_TYPES = {"f16": (2.0, 1), "q8_0": (34 / 32, 8), "q4_0": (18 / 32, 2)}  # bytes/element, ggml type id
GPU_MARGIN_BYTES = 1024 * MIB  # kept free per GPU, like llama.cpp's --fit-target
HOST_MARGIN_BYTES = 2 * GIB
UBATCH = 512
LAUNCHERS = ("python", "native")  # llama-cpp-python's server | the native llama-server


def kv_bytes_per_token_layer(facts: ModelFacts, kv_type: str) -> float:
    """K and V of one token in one layer (MLA: the 576-element latent only, recent builds)."""
    size = KV_TYPES[kv_type][0]
    if facts.is_mla:
        return (facts.kv_lora_rank + facts.qk_rope_head_dim) * size
    key = facts.gguf_key_length or facts.head_dim
    value = facts.gguf_value_length or facts.head_dim
    return facts.num_kv_heads * (key + value) * size


def kv_layer_bytes(facts: ModelFacts, layer: int, kv_type: str, n_ctx: int, launcher: str) -> int:
    """One layer's KV cache; the native server gives sliding-window layers a window-sized cache."""
    cells = n_ctx
    sliding = facts.sliding_window and layer < facts.sliding_layers  # approximate: which ones is per-arch
    if sliding and launcher == "native" and facts.sliding_window:
        cells = min(n_ctx, facts.sliding_window + UBATCH)
    return int(cells * kv_bytes_per_token_layer(facts, kv_type))


def uses_flash_attention(launcher: str, gpus: tuple[Gpu, ...]) -> bool:
    """The native server turns it on by itself; with llama-cpp-python we turn it on for GPUs, where
    without it the attention scores of a long context need gigabytes of scratch per device."""
    return launcher == "native" or bool(gpus)


def compute_buffer_bytes(facts: ModelFacts, n_ctx: int, flash_attention: bool, holds_output: bool) -> int:
    """Scratch for one ubatch. Without flash attention: the attention scores of 512 tokens × n_ctx ×
    heads in f32, twice (514 MiB for Gemma 270M at 32k, as logged). With it: the ubatch's logits on
    the device holding the output layer (300 MiB logged for a 152k vocabulary)."""
    if not flash_attention:
        return 2 * n_ctx * UBATCH * facts.num_heads * 4 + 8 * MIB
    if not holds_output:
        return 256 * MIB  # 202-396 MiB logged on the GPUs without the output layer
    # routing a ubatch over many experts needs more scratch: +600 and +900 MiB logged for two MoE models
    return UBATCH * facts.vocab_size * 4 + (512 if facts.is_moe else 32) * MIB


@dataclass(frozen=True)
class Placement:
    n_gpu_layers: int  # llama.cpp's -ngl (blocks + the output slot)
    n_cpu_moe: int  # blocks whose expert tensors stay in RAM (native only)
    tensor_split: tuple[float, ...]
    device_model: tuple[int, ...]
    device_kv: tuple[int, ...]
    device_compute: tuple[int, ...]
    device_usable: tuple[int, ...]
    host_model: int
    host_kv: int
    host_compute: int

    @property
    def host_total(self) -> int:
        return self.host_model + self.host_kv + self.host_compute

    def overflow(self) -> list[int]:
        used = (m + k + c for m, k, c in zip(self.device_model, self.device_kv, self.device_compute, strict=True))
        return [
            index for index, (total, usable) in enumerate(zip(used, self.device_usable, strict=True)) if total > usable
        ]


def _slot_costs(
    facts: ModelFacts, n_ctx: int, kv_type: str, launcher: str, n_cpu_moe: int
) -> list[tuple[int, int, int]]:
    """Per slot (blocks, then the output layer): (weights on the GPU, expert weights kept in RAM, KV)."""
    costs = []
    for slot in range(facts.num_layers):
        size = facts.layer_bytes[slot] if facts.layer_bytes else 0
        experts = facts.expert_layer_bytes[slot] if facts.expert_layer_bytes and slot < n_cpu_moe else 0
        costs.append((size - experts, experts, kv_layer_bytes(facts, slot, kv_type, n_ctx, launcher)))
    costs.append((facts.output_bytes, 0, 0))
    return costs


def place(
    facts: ModelFacts,
    gpus: tuple[Gpu, ...],
    n_ctx: int,
    kv_type: str,
    launcher: str,
    n_gpu_layers: int,
    n_cpu_moe: int = 0,
    split: tuple[float, ...] | None = None,
) -> Placement:
    """Memory per device for one placement (pure arithmetic; see :func:`best_placement`).

    ``split`` defaults to llama.cpp's own rule: proportional to each GPU's usable memory."""
    layers = facts.num_layers
    slots = min(n_gpu_layers, layers + 1) if gpus else 0
    first_gpu_slot = layers + 1 - slots  # slots >= this are on a GPU; slot `layers` is the output
    flash = uses_flash_attention(launcher, gpus)
    usable = [max(0, g.free_bytes - GPU_MARGIN_BYTES) for g in gpus]
    if split is None and gpus:
        room = [max(1, u - compute_buffer_bytes(facts, n_ctx, flash, i == len(gpus) - 1)) for i, u in enumerate(usable)]
        split = tuple(round(r / sum(room), 4) for r in room)
    split = split or ()
    cumulative = [sum(split[: i + 1]) / sum(split) for i in range(len(split))] if sum(split) else []
    model, kv = [0] * len(gpus), [0] * len(gpus)
    host_model, host_kv = facts.embedding_bytes, 0
    output_device: int | None = None
    for slot, (on_gpu, in_ram, cache) in enumerate(_slot_costs(facts, n_ctx, kv_type, launcher, n_cpu_moe)):
        if slot < first_gpu_slot:
            host_model += on_gpu + in_ram
            host_kv += cache
            continue
        position = (slot - first_gpu_slot) / slots
        device = next((i for i, edge in enumerate(cumulative) if position < edge - 1e-9), len(gpus) - 1)
        model[device] += on_gpu
        kv[device] += cache
        host_model += in_ram
        if slot == layers:
            output_device = device
    compute = tuple(compute_buffer_bytes(facts, n_ctx, flash, i == output_device) for i in range(len(gpus)))
    host_compute = compute_buffer_bytes(facts, n_ctx, flash, True) if output_device is None else 64 * MIB
    return Placement(
        n_gpu_layers=slots,
        n_cpu_moe=n_cpu_moe,
        tensor_split=split,
        device_model=tuple(model),
        device_kv=tuple(kv),
        device_compute=compute,
        device_usable=tuple(usable),
        host_model=host_model,
        host_kv=host_kv,
        host_compute=host_compute,
    )


def _filled_split(
    facts: ModelFacts, gpus: tuple[Gpu, ...], n_ctx: int, kv_type: str, launcher: str, n_gpu_layers: int, n_cpu_moe: int
) -> tuple[float, ...] | None:
    """A split that fills each GPU in turn with whole slots, when the proportional one overflows a
    card (uneven layers, the output layer's logits); None when the slots cannot fit at all."""
    flash = uses_flash_attention(launcher, gpus)
    logits_extra = compute_buffer_bytes(facts, n_ctx, flash, True) - compute_buffer_bytes(facts, n_ctx, flash, False)
    room = [max(0, g.free_bytes - GPU_MARGIN_BYTES) - compute_buffer_bytes(facts, n_ctx, flash, False) for g in gpus]
    costs = _slot_costs(facts, n_ctx, kv_type, launcher, n_cpu_moe)[facts.num_layers + 1 - n_gpu_layers :]
    counts = [0] * len(gpus)
    device = 0
    for index, (on_gpu, _, cache) in enumerate(costs):
        need = on_gpu + cache + (logits_extra if index == len(costs) - 1 else 0)
        while device < len(gpus) and need > room[device]:
            device += 1
        if device == len(gpus):
            return None
        room[device] -= need
        counts[device] += 1
    return tuple(float(count) for count in counts)  # llama.cpp normalizes: '10,11' means 10 and 11 slots


def best_placement(
    facts: ModelFacts, gpus: tuple[Gpu, ...], n_ctx: int, kv_type: str, launcher: str
) -> tuple[Placement, str]:
    """Everything on the GPUs if it fits; else (native) MoE experts to RAM first; else fewer layers."""
    full = facts.num_layers + 1
    if not gpus:
        return place(facts, gpus, n_ctx, kv_type, launcher, 0), "CPU only"

    def fitting(layers: int, moe: int = 0) -> Placement | None:
        proportional = place(facts, gpus, n_ctx, kv_type, launcher, layers, moe)
        if not proportional.overflow():
            return proportional
        split = _filled_split(facts, gpus, n_ctx, kv_type, launcher, layers, moe)
        filled = place(facts, gpus, n_ctx, kv_type, launcher, layers, moe, split) if split else None
        return filled if filled and not filled.overflow() else None

    if everything := fitting(full):
        return everything, "all layers on GPU"
    if launcher == "native" and facts.is_moe and facts.expert_layer_bytes:
        for moe in range(1, facts.num_layers + 1):
            if partial := fitting(full, moe):
                return partial, f"experts of {moe} layers in RAM"
    for layers in range(full - 1, 0, -1):
        if partial := fitting(layers):
            return partial, f"{layers} of {full} layers on GPU"
    return place(facts, gpus, n_ctx, kv_type, launcher, 0), "CPU only (not one layer fits a GPU)"


def _mib(value: int) -> float:
    return round(value / MIB, 1)


@dataclass
class LlamaCppCandidate:
    checkpoint: str
    launcher: str
    n_ctx: int
    kv_type: str
    placement: Placement
    fits: bool
    reason: str
    level: int
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def context(self) -> int:
        return self.n_ctx

    def to_json(self) -> dict[str, Any]:
        p = self.placement
        memory = {
            f"GPU{i}": {
                "model": _mib(p.device_model[i]),
                "kv": _mib(p.device_kv[i]),
                "compute": _mib(p.device_compute[i]),
                "usable": _mib(p.device_usable[i]),
            }
            for i in range(len(p.device_model))
        }
        memory["host"] = {"model": _mib(p.host_model), "kv": _mib(p.host_kv), "compute": _mib(p.host_compute)}
        return {
            "backend": ENGINE,
            "launcher": self.launcher,
            "checkpoint": self.checkpoint,
            "fits": self.fits,
            "reason": self.reason,
            "n_gpu_layers": p.n_gpu_layers,
            "n_cpu_moe": p.n_cpu_moe,
            "tensor_split": list(p.tensor_split),
            "n_ctx": self.n_ctx,
            "kv_type": self.kv_type,
            "memory_mib": memory,
            "argv": self.argv,
            "env": self.env,
        }


def candidates(
    facts: ModelFacts,
    checkpoint: str,
    gpus: tuple[Gpu, ...],
    ram_available: int,
    *,
    min_context: int,
    max_context: int | None,
    launcher: str,
    pinned_ctx: int | None = None,
) -> list[LlamaCppCandidate]:
    """The ladder: longest context with f16 KV, then q8_0 KV, then shorter contexts (not below the
    minimum); each placed as well as the GPUs allow; host RAM decides whether it fits."""
    model_max = min(facts.max_position or FALLBACK_CONTEXT, max_context or 1 << 30)
    if pinned_ctx:
        contexts = [pinned_ctx]
    else:
        contexts = sorted(
            {c for c in (model_max, 131072, 65536, min_context) if c <= model_max} or {model_max}, reverse=True
        )
    out: list[LlamaCppCandidate] = []
    for ctx_index, n_ctx in enumerate(contexts):
        for kv_index, kv_type in enumerate(("f16", "q8_0")):
            placement, how = best_placement(facts, gpus, n_ctx, kv_type, launcher)
            host_need = placement.host_total + HOST_MARGIN_BYTES
            problems = []
            if host_need > ram_available:
                have = ram_available / GIB
                problems.append(
                    f"needs {host_need / GIB:.1f} GiB of RAM (2 GiB margin included), {have:.1f} GiB available"
                )
            if n_ctx < min_context:
                problems.append(f"context {n_ctx:,} < the {min_context:,} required")
            gpu_part = ", ".join(
                f"GPU{i} {(m + k + c) / GIB:.1f}/{u / GIB:.1f} GiB"
                for i, (m, k, c, u) in enumerate(
                    zip(
                        placement.device_model,
                        placement.device_kv,
                        placement.device_compute,
                        placement.device_usable,
                        strict=True,
                    )
                )
            )
            ram = placement.host_total / GIB
            summary = f"{how} ({gpu_part or 'no GPU'}), RAM {ram:.1f} GiB, context {n_ctx:,}, KV {kv_type}"
            level = (
                (
                    0
                    if placement.n_gpu_layers > facts.num_layers and not placement.n_cpu_moe
                    else 1
                    if placement.n_cpu_moe
                    else 2
                )
                + 4 * kv_index
                + 8 * ctx_index
            )
            out.append(
                LlamaCppCandidate(
                    checkpoint,
                    launcher,
                    n_ctx,
                    kv_type,
                    placement,
                    not problems,
                    summary + ("; " + "; ".join(problems) if problems else ""),
                    level,
                )
            )
    return out


def best(candidates: list[LlamaCppCandidate]) -> LlamaCppCandidate | None:
    """The fitting candidate with the fewest concessions, then the longest context."""
    fitting = [c for c in candidates if c.fits]
    return min(fitting, key=lambda c: (c.level, -c.n_ctx)) if fitting else None


def plan_argv(
    candidate: LlamaCppCandidate,
    *,
    served_name: str,
    gguf: str,
    command: list[str] | None = None,
    chat_format: str | None = None,
) -> list[str]:
    """argv for the candidate's launcher, with PORT/KEY placeholders that `serve` fills in."""
    p = candidate.placement
    config = LlamaCppConfig(
        gguf=Path(gguf),
        served_name=served_name,
        context_length=candidate.n_ctx,
        chat_format=chat_format,
        gpu_layers=p.n_gpu_layers,
        tensor_split=p.tensor_split,
        kv_type=candidate.kv_type,
        launcher=candidate.launcher,
        n_cpu_moe=p.n_cpu_moe,
    )
    if candidate.launcher == "native":
        return native_argv(config, command=command or ["llama-server"], port="PORT", api_key="KEY")
    return server_argv(config, command=command or ["python", "-m", "llama_cpp.server"], port="PORT", api_key="KEY")


@dataclass(frozen=True)
class LlamaCppOption:
    """A llama.cpp placement the supervisor can start and remember."""

    config: LlamaCppConfig
    command: tuple[str, ...]
    fetch: Callable[[], Path] | None = None  # downloads the GGUF when it is not local yet
    engine: str = ENGINE

    def prepare(self) -> LlamaCppOption:
        if self.fetch is None:
            return self
        return replace(self, config=replace(self.config, gguf=self.fetch()), fetch=None)

    @property
    def label(self) -> str:
        c = self.config
        split = f", split {','.join(f'{s:g}' for s in c.tensor_split)}" if len(c.tensor_split) > 1 else ""
        return f"llama.cpp {c.gguf.name}, context {c.context_length}, KV {c.kv_type}, {c.gpu_layers} GPU layers{split}"

    @property
    def context_length(self) -> int:
        return self.config.context_length

    @property
    def weights_key(self) -> tuple[object, ...]:
        return (str(self.config.gguf), self.config.gpu_layers, self.config.tensor_split)

    def launch(self, port: int, api_key: str) -> Launch:
        return build_launch(self.config, port=port, api_key=api_key, command=list(self.command))

    def classify(self, line: str) -> Failure | None:
        return classify(line)

    def after(self, failure: Failure) -> LlamaCppOption | None:
        """Out of memory: a q8_0 KV cache needs about half the memory of f16; try that once."""
        if failure.kind is FailureKind.OUT_OF_MEMORY and self.config.kv_type == "f16":
            return replace(self, config=replace(self.config, kv_type="q8_0"))
        return None

    def memo(self) -> dict[str, Any]:
        c = self.config
        return {
            "gguf": str(c.gguf),
            "context_length": c.context_length,
            "gpu_layers": c.gpu_layers,
            "tensor_split": list(c.tensor_split),
            "kv_type": c.kv_type,
        }

    def from_memo(self, memo: dict[str, Any]) -> LlamaCppOption:
        config = replace(
            self.config,
            gguf=Path(memo["gguf"]),
            context_length=int(memo["context_length"]),
            gpu_layers=int(memo["gpu_layers"]),
            tensor_split=tuple(memo["tensor_split"]),
            kv_type=str(memo["kv_type"]),
        )
        return replace(self, config=config)
