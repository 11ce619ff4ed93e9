"""What ``serve`` needs to start a vLLM group over nodes (planned in gateway/backends/vllm/multinode.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GroupPlan:
    """The worker nodes of ranks 1… in order, and this machine's address and interface on the way to
    them (the master address, rank 0's VLLM_HOST_IP and GLOO_/NCCL_SOCKET_IFNAME)."""

    nodes: tuple[str, ...]
    head_address: str
    head_interface: str
