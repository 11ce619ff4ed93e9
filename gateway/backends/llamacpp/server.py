"""A whole llama-server that a worker runs for a head on another node (a replica there): its address and
port flags, and the variables it reads (its key: ``LLAMA_API_KEY``, or llama-cpp-python's ``API_KEY``)."""

from __future__ import annotations

from gateway.backends.llamacpp.argv import ENGINE, INHERITED_ENV
from gateway.backends.server_host import ServerHost

SERVER_HOST = ServerHost(ENGINE, "llama-server", INHERITED_ENV, env_prefixes=("LLAMA_", "API_KEY", "GGML_", "CUDA_"))
