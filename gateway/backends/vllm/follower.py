"""A worker's side of vLLM across nodes: one headless rank of the head's group, on this node's own vLLM
(and a whole server: a replica on the worker, :data:`SERVER_HOST`).

The head sends the engine's arguments (``--model`` form, the group's ``--nnodes``/``--node-rank``/
``--master-addr``/``--master-port`` included, ``--headless`` last); the worker puts its own vLLM command
in front. Through the api_server module, which ignores ``--headless``, the follower runs vLLM's own
headless entry instead (``multinode.HEADLESS_ENTRY``; vllm/entrypoints/cli/serve.py ``run_headless``).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.backends.server_host import ServerHost
from gateway.backends.vllm.multinode import API_SERVER_MODULE, HEADLESS_ENTRY, group_env


class VllmFollowerHost:
    engine = "vllm"
    title = "vLLM"
    inherit: tuple[str, ...] = ("VLLM_",)  # vLLM's own knobs (VLLM_CPU_KVCACHE_SPACE…) reach the follower

    def argv(self, command: Sequence[str], args: Sequence[str]) -> list[str]:
        words = list(command)
        if len(words) >= 2 and words[-2:] == ["-m", API_SERVER_MODULE]:
            return [*words[:-2], "-c", HEADLESS_ENTRY, *args]
        return [*words, *args]

    def env(self, host_ip: str, interface: str) -> dict[str, str]:
        base = {"PYTORCH_ALLOC_CONF": "expandable_segments:True", "VLLM_NO_USAGE_STATS": "1"}
        return base | group_env(host_ip, interface)


HOST = VllmFollowerHost()

# a whole `vllm serve` that a worker runs for a head (a replica on its node): the key in VLLM_API_KEY, the
# CPU build's and CUDA's device choice, PyTorch's allocator setting
SERVER_HOST = ServerHost("vllm", "vLLM", ("VLLM_",), env_prefixes=("VLLM_", "PYTORCH_", "CUDA_"))
