"""The machine as the planner sees it: GPUs from NVML (or a simulated spec) and host RAM.

The NVML probe is one small function so it can be exercised on a GPU node; everything else is pure
data. ``parse_gpu_spec("2x32GiB@12.0:free=30GiB")`` builds the same inventory for what-if plans and
tests.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gateway.core.errors import ConfigError

log = logging.getLogger("gateway.hardware")

GIB = 1024**3
MIB = 1024**2
_UNITS = {
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": MIB,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": GIB,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
DEFAULT_COMPUTE_CAPABILITY = (8, 9)  # an RTX 40xx-class card when a simulated spec names none


@dataclass(frozen=True)
class Device:
    """One device the planner can place layers on: a local GPU, the host's CPU and RAM (``kind``
    "cpu"), or a device another node lends (``node`` set). The one device model: every JSON, the
    worker, the survey and the plan use it."""

    index: int
    name: str
    total_bytes: int
    free_bytes: int
    compute_capability: tuple[int, int]
    node: str = ""  # "" for this machine; else the worker node's name (issue 13)
    endpoint: str = ""  # a remote device's "host:port", where its node serves it to the head
    link: str = ""  # how the head reaches it, as the plan's reasons say it ("TCP to node2:50100, 0.40 ms round trip")
    rtt_ms: float | None = None  # that link's measured round trip; None: not measured (simulated, unknown)
    kind: str = "gpu"  # "gpu" | "cpu" (the host's RAM, or a node lending its CPU)

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"

    @property
    def is_remote(self) -> bool:
        return bool(self.node)

    @property
    def label(self) -> str:
        """The one name /status and /metrics give a device (their ``gpu``): its index on its own node,
        as NVML (and ``--gpus``'s simulated list) numbers it, with the node in front for another node's
        device ("node2/0"). Never a position in an engine's device order."""
        return f"{self.node}/{self.index}" if self.node else str(self.index)

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB

    @property
    def capability(self) -> str:
        """The compute capability as NVIDIA writes it ("8.9"), the one way it is shown or sent."""
        return "{}.{}".format(*self.compute_capability)

    def to_json(self) -> dict[str, Any]:
        """The device as every JSON of the gateway carries it (plan, ``gpus --json``, a worker's
        inventory); a remote device adds its node, endpoint and link."""
        data: dict[str, Any] = {
            "index": self.index,
            "name": self.name,
            "total_bytes": self.total_bytes,
            "free_bytes": self.free_bytes,
            "compute_capability": self.capability,
            "kind": self.kind,
        }
        if self.is_remote:
            data |= {"node": self.node, "endpoint": self.endpoint, "link": self.link}
        return data

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], **where: Any) -> Device:
        """The inverse of :meth:`to_json`; ``where`` sets what the reader knows better (node, link...)."""
        major, _, minor = str(raw.get("compute_capability") or "0.0").partition(".")
        fields: dict[str, Any] = {
            "index": int(raw["index"]),
            "name": str(raw.get("name") or "device"),
            "total_bytes": int(raw["total_bytes"]),
            "free_bytes": int(raw["free_bytes"]),
            "compute_capability": (int(major or 0), int(minor or 0)),
            "node": str(raw.get("node", "")),
            "endpoint": str(raw.get("endpoint", "")),
            "link": str(raw.get("link", "")),
            "kind": str(raw.get("kind") or "gpu"),
        }
        return cls(**(fields | where))


@dataclass(frozen=True)
class Peer:
    """Another node as an engine group sees it (its worker's report and the head's connection to it):
    the engines it can run a rank of, with their versions, and the addresses the ranks use."""

    node: str
    engines: Mapping[str, str]  # engine name → version installed on that node ("vllm" → "0.32.0+cpu")
    address: str  # the node's IP as this machine reaches it (its ranks' VLLM_HOST_IP-like address)
    head_address: str  # this machine's IP on the way to it (the group's master address)
    head_interface: str  # this machine's network interface with head_address ("" when unknown)


@dataclass(frozen=True)
class Inventory:
    gpus: tuple[Device, ...]
    ram_total_bytes: int
    ram_available_bytes: int
    peer_to_peer: bool = False
    source: str = "nvml"  # "nvml" | "simulated" | "none"
    notes: tuple[str, ...] = field(default=())
    remote: tuple[Device, ...] = ()  # other nodes' devices (``Device.node`` set), lent by their workers
    peers: tuple[Peer, ...] = ()  # the other nodes that can run a rank of an engine group, in workers' order

    @property
    def nodes(self) -> dict[str, tuple[Device, ...]]:
        """GPUs per node, this machine ("") first, then each worker in the order given."""
        grouped: dict[str, list[Device]] = {"": list(self.gpus)}
        for gpu in self.remote:
            grouped.setdefault(gpu.node, []).append(gpu)
        return {node: tuple(gpus) for node, gpus in grouped.items()}

    @property
    def fingerprint(self) -> str:
        """Identifies the GPU set for remembering configurations: names and sizes, not free memory;
        other nodes' devices (with their node) after this machine's."""
        local = ",".join(f"{g.name}:{g.total_bytes // MIB}MiB@{g.capability}" for g in self.gpus)
        remote = ",".join(f"{g.node}/{g.name}:{g.total_bytes // MIB}MiB" for g in self.remote)
        return (local or "cpu") + (f"+{remote}" if remote else "")

    @property
    def host(self) -> Device:
        """This machine's CPU and RAM as a device (what a CPU plan places on)."""
        return Device(0, "CPU (host RAM)", self.ram_total_bytes, self.ram_available_bytes, (0, 0), kind="cpu")

    @property
    def devices(self) -> tuple[Device, ...]:
        """The one list: this machine's GPUs, its host (CPU and RAM), then the other nodes' devices."""
        return (*self.gpus, self.host, *self.remote)

    def to_json(self) -> dict[str, Any]:
        """The inventory as every JSON of the gateway gives it (``plan --json``, ``gpus --json``)."""
        return {
            "source": self.source,
            "devices": [device.to_json() for device in self.devices],
            "peer_to_peer": self.peer_to_peer,
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Inventory:
        """The inverse of :meth:`to_json`."""
        devices = [Device.from_json(raw) for raw in data.get("devices", [])]
        host = next((d for d in devices if d.is_cpu and not d.is_remote), None)
        return cls(
            gpus=tuple(d for d in devices if not d.is_cpu and not d.is_remote),
            ram_total_bytes=host.total_bytes if host else 0,
            ram_available_bytes=host.free_bytes if host else 0,
            peer_to_peer=bool(data.get("peer_to_peer")),
            source=str(data.get("source", "nvml")),
            notes=tuple(data.get("notes", ())),
            remote=tuple(d for d in devices if d.is_remote),
        )

    def with_ram(self, ram_bytes: int) -> Inventory:
        return replace(self, ram_total_bytes=ram_bytes, ram_available_bytes=ram_bytes)


SIZE_FORMS = "32GiB, 24GB, 512MiB, 1.5TiB or 64G"


def parse_size(text: str) -> int:
    """'32GiB', '24 GB', '512MiB', '1.5TiB', '64G' → bytes. A bare number is refused: people write
    `--gpus 2x32` or `--ram 64` meaning GiB, and reading them as bytes planned a machine without GPUs.
    (No caller passes byte counts as text; programs hand over ints.)"""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if not match or (unit and unit not in _UNITS):
        raise ConfigError(f"cannot read size {text!r}: write it like {SIZE_FORMS}")
    if not unit:
        raise ConfigError(f"size {text!r} has no unit: write it like {SIZE_FORMS}")
    return int(float(match.group(1)) * _UNITS[unit])


# the most simulated GPUs a plan is asked about (a node has up to 8-16; a few nodes together): more is a
# typo, and planning 100,000 of them would run for minutes
MAX_GPUS = 64


def parse_gpu_spec(spec: str) -> tuple[Device, ...]:
    """'2x32GiB', '1x12GiB,1x24GiB', '2x32GiB@12.0', '1x24GiB:free=20GiB' → simulated GPUs."""
    gpus: list[Device] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        match = re.fullmatch(
            r"(?:(\d+)\s*x\s*)?([0-9.]+\s*[a-zA-Z]*)(?:@(\d+)\.(\d+))?(?::free=([0-9.]+\s*[a-zA-Z]*))?", part
        )
        if not match:
            raise ConfigError(
                f"cannot read GPU spec {part!r}: write it like 2x32GiB, 1x24GiB@8.9 or 1x24GiB:free=20GiB"
            )
        count = int(match.group(1) or 1)
        total = parse_size(match.group(2))
        capability = (int(match.group(3)), int(match.group(4))) if match.group(3) else DEFAULT_COMPUTE_CAPABILITY
        free = parse_size(match.group(5)) if match.group(5) else total
        if count < 1 or free > total:
            raise ConfigError(f"GPU spec {part!r}: need at least one GPU and free memory no larger than total")
        if len(gpus) + count > MAX_GPUS:
            raise ConfigError(
                f"GPU spec {spec[:80]!r}: more than {MAX_GPUS} GPUs (a node has 8-16): write it like 8x80GiB"
            )
        for _ in range(count):
            gpus.append(Device(len(gpus), f"simulated {total / GIB:g}GiB", total, free, capability))
    if not gpus:
        raise ConfigError("empty GPU spec: write it like 2x32GiB")
    return tuple(gpus)


def slowest_link(gpus: Sequence[Device]) -> str | None:
    """The reasons' "slowest link": the remote device whose worker answered slowest (unmeasured ones
    count as slowest)."""
    remote = [g for g in gpus if g.is_remote]
    if not remote:
        return None
    slowest = max(remote, key=lambda g: float("inf") if g.rtt_ms is None else g.rtt_ms)
    return f"{slowest.node} ({slowest.link})"


def parse_remote_gpus(spec: str) -> tuple[Device, ...]:
    """'node2=2x24GiB;node3=1x12GiB' → other nodes' GPUs, simulated (for planning without the nodes):
    each node's part is a GPU spec as for ``--gpus``; endpoints are left empty."""
    gpus: list[Device] = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        node, sep, gpu_spec = part.partition("=")
        if not sep or not node.strip():
            raise ConfigError(f"cannot read remote GPU spec {part!r}: write it like node2=2x24GiB;node3=1x12GiB")
        gpus += [replace(g, node=node.strip(), link="simulated") for g in parse_gpu_spec(gpu_spec)]
        if len(gpus) > MAX_GPUS:
            raise ConfigError(f"remote GPU spec {spec[:80]!r}: more than {MAX_GPUS} GPUs in all: name fewer nodes")
    if not gpus:
        raise ConfigError("empty remote GPU spec: write it like node2=2x24GiB")
    return tuple(gpus)


def host_ram() -> tuple[int, int]:
    """(total, available) bytes from /proc/meminfo, capped at the cgroup memory limit if lower."""
    values: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0, 0
    total, available = values.get("MemTotal", 0), values.get("MemAvailable", 0)
    limit = _cgroup_limit()
    if limit and limit < total:
        total, available = limit, min(available, limit)
    return total, available


def _cgroup_limit() -> int | None:
    for path in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    return None


def probe_nvml() -> tuple[tuple[Device, ...], bool, str | None]:
    """(GPUs, all pairs peer-to-peer capable, why none) as NVML reports them."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return (), False, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return (), False, str(exc)
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        gpus = []
        for index, handle in enumerate(handles):
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append(
                Device(
                    index, name.decode() if isinstance(name, bytes) else name, memory.total, memory.free, (major, minor)
                )
            )
        p2p = len(handles) > 1 and all(
            pynvml.nvmlDeviceGetP2PStatus(a, b, pynvml.NVML_P2P_CAPS_INDEX_READ) == pynvml.NVML_P2P_STATUS_OK
            for i, a in enumerate(handles)
            for b in handles[i + 1 :]
        )
        return tuple(gpus), p2p, None
    except pynvml.NVMLError as exc:
        return (), False, str(exc)
    finally:
        pynvml.nvmlShutdown()


def inventory(gpu_spec: str | None = None, ram: str | None = None) -> Inventory:
    """The real machine, or the simulated one the spec describes; ``ram`` overrides host RAM."""
    total, available = host_ram()
    if gpu_spec:
        result = Inventory(parse_gpu_spec(gpu_spec), total, available, peer_to_peer=False, source="simulated")
    else:
        gpus, p2p, why = probe_nvml()
        notes: tuple[str, ...] = ()
        if not gpus:
            notes = (f"no NVIDIA GPU found ({why}): planning for CPU",)
            log.info("%s", notes[0])
        result = Inventory(gpus, total, available, p2p, source="nvml" if gpus else "none", notes=notes)
    return result.with_ram(parse_size(ram)) if ram else result
