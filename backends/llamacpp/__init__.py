"""llama.cpp: placement per device (``placement``), the ladder of contexts and KV types (``ladder``),
its two launchers and their argv (``launchers``), its log lines (``logs``), the startable option
(``option``), the catalog table and GGUF facts (``source``, ``gguf_facts``), and the seam the gateway
talks to (``backend``)."""

from backends.llamacpp.backend import LAUNCHERS, LlamaCppBackend
from backends.llamacpp.gguf_facts import GgufFacts, estimate_gguf_facts, facts_from_gguf, gguf_bits_from_name
from backends.llamacpp.ladder import LlamaCppCandidate, best, candidates
from backends.llamacpp.launchers import (
    HEALTH_PATH,
    NATIVE_HEALTH_PATH,
    LlamaCppConfig,
    build_launch,
    default_command,
    installed_version,
    native_argv,
    plan_argv,
    server_argv,
)
from backends.llamacpp.logs import classify, memory_line
from backends.llamacpp.option import LlamaCppOption
from backends.llamacpp.placement import (
    GPU_MARGIN_BYTES,
    HOST_MARGIN_BYTES,
    KV_TYPES,
    Placement,
    best_placement,
    compute_buffer_bytes,
    kv_layer_bytes,
    place,
)
from backends.llamacpp.settings import LlamaCppSettings
from backends.llamacpp.source import LlamaCppModel, LlamaCppSource, ensure_gguf

BACKEND = LlamaCppBackend()

__all__ = [
    "BACKEND",
    "GPU_MARGIN_BYTES",
    "HEALTH_PATH",
    "HOST_MARGIN_BYTES",
    "KV_TYPES",
    "LAUNCHERS",
    "NATIVE_HEALTH_PATH",
    "GgufFacts",
    "LlamaCppBackend",
    "LlamaCppCandidate",
    "LlamaCppConfig",
    "LlamaCppModel",
    "LlamaCppOption",
    "LlamaCppSettings",
    "LlamaCppSource",
    "Placement",
    "best",
    "best_placement",
    "build_launch",
    "candidates",
    "classify",
    "compute_buffer_bytes",
    "default_command",
    "ensure_gguf",
    "estimate_gguf_facts",
    "facts_from_gguf",
    "gguf_bits_from_name",
    "installed_version",
    "kv_layer_bytes",
    "memory_line",
    "native_argv",
    "place",
    "plan_argv",
    "server_argv",
]
