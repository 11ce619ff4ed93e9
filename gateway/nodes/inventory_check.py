"""A worker's ``/inventory`` answer checked against types and caps before the head plans with it.

Why: the head took a worker's JSON as it came. A list where an object belongs, a number like ``1e400``
or deep nesting raised from the survey (during a re-plan that left the gateway stuck for good);
100k devices took the planner over 300 s; an endpoint ``a:1,b:2`` put a host of the worker's choosing
into llama-server's ``--rpc``; a node name with a newline or an ANSI escape reached pasted steps and the
terminal. Here each field has one type and a bound, and anything else is a :class:`Malformed` answer,
whose worker is planned without (the survey names it in the log).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MAX_DEVICES = 64  # devices one worker may lend (a node has at most 16 GPUs, plus its CPU)
MAX_BYTES = 1 << 50  # 1 PiB: more than any device's or node's memory
MAX_INDEX = 1023
MAX_TEXT = 128  # a device's name, a build string
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}")  # a host name, printable and bounded
ENDPOINT = re.compile(r"(?:\[[0-9a-fA-F:]{2,39}\]|[A-Za-z0-9][A-Za-z0-9.-]{0,252}):(\d{1,5})")  # one host:port
KINDS = ("gpu", "cpu")


class Malformed(ValueError):
    """A worker's answer that does not have the inventory's shape; the message says which field."""


@dataclass(frozen=True)
class CheckedDevice:
    index: int
    name: str
    total_bytes: int
    free_bytes: int
    compute_capability: str
    endpoint: str
    kind: str

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


@dataclass(frozen=True)
class CheckedInventory:
    node: str | None  # None when the worker gave no name (the head then names it by its address)
    build: str
    ram_total_bytes: int
    ram_available_bytes: int
    devices: tuple[CheckedDevice, ...]  # running ones with an endpoint: the ones it can lend


def check(data: Any) -> CheckedInventory:
    """The answer's fields, each of its type and within its bound; :class:`Malformed` otherwise."""
    if not isinstance(data, dict):
        raise Malformed(f"the answer is a JSON {type(data).__name__}, not an object")
    node = data.get("node")
    if node is not None and not (isinstance(node, str) and NODE_NAME.fullmatch(node)):
        raise Malformed("its node name is not a host name of at most 64 printable characters")
    raw_devices = data.get("devices", [])
    if not isinstance(raw_devices, list):
        raise Malformed("'devices' is not a list")
    if len(raw_devices) > MAX_DEVICES:
        raise Malformed(f"it reports {len(raw_devices)} devices, more than the {MAX_DEVICES} a worker may lend")
    devices = tuple(d for d in (_device(raw, n) for n, raw in enumerate(raw_devices)) if d is not None)
    total = _size(data.get("ram_total_bytes", 0), "ram_total_bytes")
    available = _size(data.get("ram_available_bytes", 0), "ram_available_bytes")
    return CheckedInventory(node, _text(data.get("build", ""), "build"), total, available, devices)


def _device(raw: Any, number: int) -> CheckedDevice | None:
    """One device (None when it does not run or has no endpoint: nothing to lend)."""
    where = f"device {number}"
    if not isinstance(raw, dict):
        raise Malformed(f"{where} is not an object")
    running = raw.get("running", True)
    if not isinstance(running, bool):
        raise Malformed(f"{where}: 'running' is not true or false")
    endpoint = raw.get("endpoint")
    if not running or not endpoint:
        return None
    if not isinstance(endpoint, str) or not (match := ENDPOINT.fullmatch(endpoint)) or not 0 < int(match[1]) < 65536:
        raise Malformed(f"{where}: its endpoint is not one host:port")
    index = raw.get("index")
    if not (isinstance(index, int) and not isinstance(index, bool) and 0 <= index <= MAX_INDEX):
        raise Malformed(f"{where}: 'index' is not an integer from 0 to {MAX_INDEX}")
    total, free = (
        _size(raw.get("total_bytes"), f"{where}'s total_bytes"),
        _size(raw.get("free_bytes"), f"{where}'s free_bytes"),
    )
    capability = raw.get("compute_capability") or "0.0"
    if not (isinstance(capability, str) and re.fullmatch(r"\d{1,2}\.\d{1,2}", capability)):
        raise Malformed(f"{where}: 'compute_capability' is not like 8.6")
    kind = raw.get("kind") or "gpu"
    if kind not in KINDS:
        raise Malformed(f"{where}: 'kind' is not gpu or cpu")
    name = _text(raw.get("name") or "device", f"{where}'s name")
    return CheckedDevice(index, name, total, min(free, total), capability, endpoint, kind)


def _size(value: Any, what: str) -> int:
    if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_BYTES):
        raise Malformed(f"{what} is not a byte count from 0 to 1 PiB")
    return value


def _text(value: Any, what: str) -> str:
    if not (isinstance(value, str) and len(value) <= MAX_TEXT and value.isprintable()):
        raise Malformed(f"{what} is not text of at most {MAX_TEXT} printable characters")
    return value
