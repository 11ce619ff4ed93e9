"""vLLM: what each release can load and how it stores KV (``releases``), memory term by term
(``memory``), the tuned ladder (``ladder``), TP×PP across nodes, planned only (``multinode``), argv
(``argv``), its log lines (``logs``), the startable option (``option``), finding it (``install``), the
catalog table and model facts (``source``), and the seam the gateway talks to (``backend``)."""

from gateway.backends.vllm.argv import HEALTH_PATH, build_argv, build_env
from gateway.backends.vllm.backend import VllmBackend
from gateway.backends.vllm.install import detect, installed_version, is_cpu_build
from gateway.backends.vllm.ladder import (
    DEFAULT_UTILIZATION,
    Concessions,
    VllmCandidate,
    best,
    cpu_candidate,
    evaluate,
    ladder,
    ranked,
    valid_tp_sizes,
)
from gateway.backends.vllm.logs import adjust, classify
from gateway.backends.vllm.memory import (
    DEFAULT_VERSION,
    Checkpoint,
    VllmFlags,
    VllmMemory,
    batch_defaults,
    kv_bytes_per_token,
    memory,
)
from gateway.backends.vllm.option import VllmOption
from gateway.backends.vllm.settings import VllmSettings
from gateway.backends.vllm.source import VllmModel, VllmSource

BACKEND = VllmBackend()

__all__ = [
    "BACKEND",
    "DEFAULT_UTILIZATION",
    "DEFAULT_VERSION",
    "HEALTH_PATH",
    "Checkpoint",
    "Concessions",
    "VllmBackend",
    "VllmCandidate",
    "VllmFlags",
    "VllmMemory",
    "VllmModel",
    "VllmOption",
    "VllmSettings",
    "VllmSource",
    "adjust",
    "batch_defaults",
    "best",
    "build_argv",
    "build_env",
    "classify",
    "cpu_candidate",
    "detect",
    "evaluate",
    "installed_version",
    "is_cpu_build",
    "kv_bytes_per_token",
    "ladder",
    "memory",
    "ranked",
    "valid_tp_sizes",
]
