"""Memory bandwidth of a device, the figure both engines' decode estimates divide by: decode of one
request is bound by reading the weights and the cache once per token.

Datasheet peaks, found by the GPU's name, else by its compute capability (simulated GPUs), else
:data:`DEFAULT_GPU_BANDWIDTH_GBPS`; the host's RAM at :data:`HOST_BANDWIDTH_GBPS`. And the link between
nodes that an engine's pipeline stages (or llama.cpp's RPC devices) cross on every decode step.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from gateway.core.devices import Device

# Peak memory bandwidth in GB/s (vendor datasheets), matched as a substring of the NVML name, longest first.
GPU_BANDWIDTH_GBPS = {
    "B200": 8000, "B100": 8000, "H200": 4800, "GH200": 4000, "H100 PCIe": 2000, "H100": 3350, "H800": 3350,
    "A100-SXM4-80GB": 2039, "A100 80GB PCIe": 1935, "A100": 1555, "A800": 1555, "A40": 696, "A30": 933,
    "A10G": 600, "A10": 600, "L40S": 864, "L40": 864, "L4": 300, "T4": 320, "V100": 900,
    "RTX PRO 6000": 1792, "RTX 6000 Ada": 960, "RTX A6000": 768, "RTX A5000": 768, "RTX A4000": 448,
    "RTX 5090": 1792, "RTX 5080": 960, "RTX 5070 Ti": 896, "RTX 5070": 672, "RTX 5060 Ti": 448,
    "RTX 4090": 1008, "RTX 4080": 717, "RTX 4070 Ti": 504, "RTX 4070": 504, "RTX 4060 Ti": 288,
    "RTX 3090 Ti": 1008, "RTX 3090": 936, "RTX 3080 Ti": 912, "RTX 3080": 760, "RTX 3070": 448,
    "RTX 3060": 360, "RTX 2080 Ti": 616, "TITAN RTX": 672,
}  # fmt: skip
# A typical card of each generation, for GPUs known only by compute capability (simulated inventories).
CAPABILITY_BANDWIDTH_GBPS = {
    (7, 0): 900, (7, 5): 448, (8, 0): 1555, (8, 6): 936, (8, 7): 205, (8, 9): 1008, (9, 0): 3350,
    (10, 0): 8000, (12, 0): 1792, (12, 1): 273,
}  # fmt: skip
DEFAULT_GPU_BANDWIDTH_GBPS = 500.0  # neither the name nor the compute capability is known
HOST_BANDWIDTH_GBPS = 60.0  # dual-channel DDR5 as measured by STREAM-like copies; servers have more


def gpu_bandwidth(gpu: Device) -> float:
    """Peak bandwidth in bytes/s: by name, else by compute capability, else the default."""
    return _bandwidth(gpu.name.lower(), gpu.compute_capability)


@lru_cache(maxsize=64)
def _bandwidth(name: str, capability: tuple[int, int]) -> float:
    """By the longest known name the device's contains (an "H100 NVL" is not an "H100"); cached: the plan
    asks once per placement it weighs, for the same few devices."""
    for known in sorted(GPU_BANDWIDTH_GBPS, key=len, reverse=True):
        if known.lower() in name:
            return GPU_BANDWIDTH_GBPS[known] * 1e9
    return CAPABILITY_BANDWIDTH_GBPS.get(capability, DEFAULT_GPU_BANDWIDTH_GBPS) * 1e9


# A link between nodes that the survey did not time (``--remote-gpus``, or a report without a round trip):
# a switched 1-10 GbE LAN's TCP round trip between two hosts, as ping -c 100 shows it, plus the kernel's
# socket path on both ends. The head's survey times each worker's HTTP answer (``Device.rtt_ms``).
DEFAULT_LINK_RTT_MS = 0.5
LINK_BYTES_PER_S = 1.25e9  # 10 GbE: what a token's activations (a few KiB) cost beside the round trip


def link_rtt_s(devices: Sequence[Device]) -> float:
    """The slowest round trip, in seconds, from this machine to the other nodes among ``devices`` (0 when
    all are local): measured where the survey timed it, else :data:`DEFAULT_LINK_RTT_MS`."""
    remote = [d for d in devices if d.is_remote]
    if not remote:
        return 0.0
    return max(DEFAULT_LINK_RTT_MS if d.rtt_ms is None else d.rtt_ms for d in remote) / 1000


def hop_s(rtt_s: float, payload_bytes: float) -> float:
    """One crossing of the link one way: half its round trip and the payload at :data:`LINK_BYTES_PER_S`."""
    return rtt_s / 2 + payload_bytes / LINK_BYTES_PER_S if rtt_s else 0.0
