"""llama.cpp: its two launchers as values (``launcher``), the KV cache and compute buffers
(``kv_cache``, ``compute_buffers``), placement per device (``placement``) and its search
(``placement_search``), the ladder of contexts and KV types (``ladder``), each launcher's argv
(``argv``), its log lines (``logs``), the startable option
(``option``), the catalog table and GGUF facts (``source``, ``gguf_facts``), and the seam the gateway
talks to (``backend``)."""

from gateway.backends.llamacpp.argv import (
    LlamaCppConfig,
    build_launch,
    installed_version,
    native_argv,
    plan_argv,
    server_argv,
)
from gateway.backends.llamacpp.backend import LlamaCppBackend
from gateway.backends.llamacpp.compute_buffers import compute_buffer_bytes
from gateway.backends.llamacpp.gguf_facts import GgufFacts, estimate_gguf_facts, facts_from_gguf, gguf_bits_from_name
from gateway.backends.llamacpp.kv_cache import KV_TYPES, kv_layer_bytes
from gateway.backends.llamacpp.ladder import LlamaCppCandidate, best, candidates
from gateway.backends.llamacpp.launcher import LAUNCHERS, NATIVE, PYTHON, Launcher
from gateway.backends.llamacpp.logs import classify, memory_line
from gateway.backends.llamacpp.option import LlamaCppOption
from gateway.backends.llamacpp.placement import GPU_MARGIN_BYTES, HOST_MARGIN_BYTES, Placement, place
from gateway.backends.llamacpp.placement_query import PlacementQuery
from gateway.backends.llamacpp.placement_search import best_placement
from gateway.backends.llamacpp.settings import LlamaCppSettings
from gateway.backends.llamacpp.source import LlamaCppModel, LlamaCppSource, ensure_gguf

BACKEND = LlamaCppBackend()

__all__ = [
    "BACKEND",
    "GPU_MARGIN_BYTES",
    "HOST_MARGIN_BYTES",
    "KV_TYPES",
    "LAUNCHERS",
    "NATIVE",
    "PYTHON",
    "GgufFacts",
    "Launcher",
    "LlamaCppBackend",
    "LlamaCppCandidate",
    "LlamaCppConfig",
    "LlamaCppModel",
    "LlamaCppOption",
    "LlamaCppSettings",
    "LlamaCppSource",
    "Placement",
    "PlacementQuery",
    "best",
    "best_placement",
    "build_launch",
    "candidates",
    "classify",
    "compute_buffer_bytes",
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
