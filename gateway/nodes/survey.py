"""Other nodes as the head sees them: each ``gateway worker``'s inventory, merged into one Inventory.

A survey asks every worker (``GET /inventory`` with the key, concurrently on the event loop, each call
within its own deadline); a worker that does not answer is planned without, and the plan's notes say
so. Parsing a worker's answer and merging are pure; :class:`Nodes` remembers what each survey found,
so /status and /metrics can show a node that was lost while serving and one that came back (used
again at the next re-plan).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from gateway.backends.registry import LENDER
from gateway.core.auth import bearer_header
from gateway.core.devices import GIB, Device, Inventory, Peer
from gateway.core.errors import ConfigError
from gateway.core.netif import interface_of
from gateway.core.tls import async_http_client
from gateway.nodes.inventory_check import Malformed, check
from gateway.supervision.lifecycle import NodeStatus

log = logging.getLogger("gateway.nodes")

SURVEY_TIMEOUT_S = 5.0  # each connect and read
SURVEY_DEADLINE_S = 10.0  # a worker's whole answer (each read may add up to SURVEY_TIMEOUT_S past it)
MAX_INVENTORY_BYTES = 1024 * 1024  # a worker's answer with 64 devices is ~20 KB
SURVEY_CALL_S = 2 * SURVEY_TIMEOUT_S + SURVEY_DEADLINE_S  # one worker's whole survey: handshake, answer, a read past it
CHECK_TIMEOUT_S = 3.0
CHECK_CALL_S = 2 * CHECK_TIMEOUT_S  # one health check: its connect and its answer's head
MISSES_TO_LOSE = 2  # consecutive unanswered checks before a node in use counts as gone
INVENTORY_PATH = "/inventory"
_ADDRESS = re.compile(r"^(?:\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-]+):\d{1,5}$")
_ANY = ("0.0.0.0", "::", "[::]")


def parse_workers(addresses: Sequence[str]) -> list[str]:
    """``host:port`` of each worker's HTTP side (its ``--port``), in the order given."""
    out = []
    for address in (a.strip() for a in addresses):
        if not address:
            continue
        if not _ADDRESS.match(address):
            raise ConfigError(f"cannot read worker address {address!r}: write it like node2:50100 or 10.0.0.2:50100")
        out.append(address)
    return out


@dataclass(frozen=True)
class NodeReport:
    """One worker at one survey: its devices (``Device.node`` set) or why it cannot be used."""

    address: str
    name: str
    devices: tuple[Device, ...] = ()
    ram_total_bytes: int = 0
    ram_available_bytes: int = 0
    build: str = ""
    rtt_ms: float | None = None
    error: str | None = None
    # engine groups (vLLM across nodes): the engines it runs ranks of (name → version), its address as
    # this machine reaches it, and this machine's address and interface on the way there
    engines: Mapping[str, str] = field(default_factory=dict)
    peer_address: str = ""
    head_address: str = ""
    head_interface: str = ""

    @property
    def reachable(self) -> bool:
        return self.error is None

    def peer(self) -> Peer | None:
        """This node as an engine group sees it, when it runs ranks of some engine."""
        if not self.reachable or not self.engines or not self.head_address:
            return None
        return Peer(self.name, dict(self.engines), self.peer_address, self.head_address, self.head_interface)


def _endpoint(endpoint: str, address: str) -> str:
    """A server bound to every interface is reached at the address the head used for the worker."""
    host, _, port = endpoint.rpartition(":")
    return f"{address.rpartition(':')[0]}:{port}" if host in _ANY else endpoint


def report_from(address: str, data: Any, rtt_ms: float | None) -> NodeReport:
    """A worker's ``/inventory`` answer as a report (pure): running devices only; an answer without the
    inventory's shape (``inventory_check``) is a report with an error, so the worker is planned without."""
    try:
        checked = check(data)
    except Malformed as exc:
        return NodeReport(address, address, error=f"sent an inventory that cannot be used ({exc})")
    name = checked.node or address
    link = f"TCP to {address}, {rtt_ms:.2f} ms round trip" if rtt_ms is not None else "unknown"
    devices = tuple(
        Device.from_json(raw.to_json(), node=name, endpoint=_endpoint(raw.endpoint, address), link=link, rtt_ms=rtt_ms)
        for raw in checked.devices
    )
    error = None if devices else f"no running {LENDER.server_name}"
    return NodeReport(
        address,
        name,
        devices,
        checked.ram_total_bytes,
        checked.ram_available_bytes,
        checked.build,
        rtt_ms,
        error,
        engines=_engines(data.get("group_engines")),
    )


def _engines(raw: Any) -> dict[str, str]:
    """``{"vllm": {"version": "0.32.0"}}`` from /inventory as ``{"vllm": "0.32.0"}``; anything else: none."""
    if not isinstance(raw, Mapping):
        return {}
    return {
        name: entry["version"]
        for name, entry in list(raw.items())[:MAX_GROUP_ENGINES]
        if isinstance(name, str) and _printable(name) and isinstance(entry, Mapping)
        and isinstance(entry.get("version"), str) and _printable(entry["version"])
    }  # fmt: skip


MAX_GROUP_ENGINES = 8


def _printable(text: str) -> bool:
    """A worker's engine name or version, shown in plans and logs: short and printable (it is untrusted)."""
    return 0 < len(text) <= 64 and text.isprintable()


def _group_addresses(report: NodeReport, link: _Link) -> NodeReport:
    """The report with the addresses a group's ranks use: the node's as reached, this machine's on the
    way there (both from the survey's own handshake) and its interface; unchanged when the node runs no
    ranks or cannot be reached."""
    if not report.engines or not report.reachable:
        return report
    head, peer = link.head_address, link.peer_address
    return replace(report, peer_address=peer, head_address=head, head_interface=interface_of(head) or "")


async def fetch(address: str, api_key: str | None, timeout_s: float = SURVEY_TIMEOUT_S) -> NodeReport:
    """Ask one worker for its inventory (I/O); an unreachable, refusing, slow or malformed worker is a
    report with an error. The answer is read within ``SURVEY_DEADLINE_S`` in all (a read timeout alone
    let a byte every 4 s run for ever) and up to ``MAX_INVENTORY_BYTES`` (a 600 MB body took 2 GB)."""
    headers = bearer_header(api_key)
    deadline = time.monotonic() + SURVEY_DEADLINE_S
    try:
        link = await _handshake(address, timeout_s)
        async with (
            async_http_client(timeout=timeout_s) as client,
            client.stream("GET", f"http://{address}{INVENTORY_PATH}", headers=headers) as answer,
        ):
            if answer.status_code in (401, 403):
                return NodeReport(
                    address, address, error="refused the key: give the worker's key with --worker-api-key"
                )
            if answer.status_code != 200:
                return NodeReport(address, address, error=f"answered {answer.status_code} to {INVENTORY_PATH}")
            body = await _bounded_body(answer, deadline)
    except _TooSlowOrBig as exc:
        return NodeReport(address, address, error=str(exc))
    except (OSError, httpx.HTTPError) as exc:
        return NodeReport(address, address, error=f"unreachable ({type(exc).__name__}: {exc})")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:
        return NodeReport(address, address, error=f"sent an inventory that is not JSON ({type(exc).__name__})")
    return _group_addresses(report_from(address, data, link.rtt_ms), link)


class _TooSlowOrBig(Exception):
    """A worker's answer past the survey's deadline or size cap."""


async def _bounded_body(answer: httpx.Response, deadline: float) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for part in answer.aiter_raw():
        size += len(part)
        if size > MAX_INVENTORY_BYTES:
            raise _TooSlowOrBig(f"sent an inventory over {MAX_INVENTORY_BYTES} bytes")
        if time.monotonic() > deadline:
            raise _TooSlowOrBig(f"did not finish its inventory within {SURVEY_DEADLINE_S:g} s")
        parts.append(part)
    return b"".join(parts)


@dataclass(frozen=True)
class _Link:
    """One TCP handshake with a worker: its round trip in ms (what the reasons call the link), this
    machine's address on that connection and the worker's as reached (names resolved)."""

    rtt_ms: float
    head_address: str
    peer_address: str


async def _handshake(address: str, timeout_s: float) -> _Link:
    """Connect to the worker once and close (I/O); the name's resolution and the connect within ``timeout_s``."""
    host, _, port = address.rpartition(":")
    started = time.monotonic()
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), timeout_s)
    except TimeoutError as exc:
        raise TimeoutError("timed out") from exc  # the words the blocking socket said: "TimeoutError: timed out"
    except ConnectionError as exc:  # asyncio says "Connect call failed (address)": the system's words, as before
        if not exc.errno:
            raise
        raise type(exc)(exc.errno, os.strerror(exc.errno)) from exc
    rtt_ms = (time.monotonic() - started) * 1000
    try:
        return _Link(rtt_ms, str(writer.get_extra_info("sockname")[0]), str(writer.get_extra_info("peername")[0]))
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _unique(reports: list[NodeReport]) -> list[NodeReport]:
    """Two workers reporting the same name (same hostname) are told apart by their address."""
    names = [r.name for r in reports]
    out = []
    for report in reports:
        if names.count(report.name) > 1:
            name = f"{report.name}@{report.address}"
            report = replace(report, name=name, devices=tuple(replace(g, node=name) for g in report.devices))
        out.append(report)
    return out


def merge(machine: Inventory, reports: Sequence[NodeReport]) -> Inventory:
    """This machine plus every reachable worker's devices (in the order the workers were given, which
    is llama.cpp's device order for ``--rpc``); the plan's notes name every worker left out."""
    notes = list(machine.notes)
    remote: list[Device] = []
    peers = [peer for report in reports if (peer := report.peer()) is not None]
    for report in reports:
        if not report.reachable:
            notes.append(f"worker {report.name} ({report.address}) {report.error}: planning without it")
            continue
        remote += report.devices
        sizes = ", ".join(f"{g.total_bytes / GIB:.1f} GiB" for g in report.devices)
        notes.append(f"worker {report.name} ({report.address}): {len(report.devices)} device(s) lent ({sizes})")
    return replace(machine, remote=tuple(remote), notes=tuple(notes), peers=tuple(peers))


@dataclass
class NodeState:
    """What the head knows of one worker across surveys."""

    address: str
    report: NodeReport | None = None
    in_use: bool = False  # its devices are in the live plan
    lost: int = 0  # times it disappeared while its devices were in use
    misses: int = 0  # consecutive health checks it did not answer while in use
    history: list[str] = field(default_factory=list)


def gone(states: Sequence[NodeState]) -> list[str]:
    """The nodes in use that missed enough checks in a row to count as gone (pure): a machine that
    lost power or its link sends no reset, and llama-server would wait on it for minutes."""
    return [s.report.name if s.report else s.address for s in states if s.in_use and s.misses >= MISSES_TO_LOSE]


async def answers(address: str, timeout_s: float = CHECK_TIMEOUT_S) -> bool:
    """Whether a worker's HTTP side answers ``/health`` now (I/O)."""
    try:
        async with (
            async_http_client(timeout=timeout_s) as client,
            client.stream("GET", f"http://{address}/health") as answer,
        ):
            return answer.status_code == 200  # its body is not read: a worker cannot hold the check with one
    except (OSError, httpx.HTTPError):
        return False


class Nodes:
    """The workers given to ``serve``/``plan`` and what each survey found; ``fetcher`` and ``prober``
    are the I/O (coroutines: every call to a worker is awaited on the head's event loop)."""

    def __init__(
        self,
        addresses: Sequence[str],
        api_key: str | None,
        fetcher: Callable[[str, str | None], Awaitable[NodeReport]] = fetch,
        prober: Callable[[str], Awaitable[bool]] = answers,
        *,
        survey_call_s: float = SURVEY_CALL_S,
        check_call_s: float = CHECK_CALL_S,
    ) -> None:
        self.states = [NodeState(address) for address in parse_workers(addresses)]
        self.api_key = api_key
        self.fetcher = fetcher
        self.prober = prober
        self.survey_call_s = survey_call_s
        self.check_call_s = check_call_s
        self.local: tuple[Device, ...] = ()  # this machine's GPUs at the last survey

    async def survey(self, machine: Inventory) -> Inventory:
        """Ask every worker now (concurrently) and return ``machine`` with the reachable ones' devices; a
        worker in use that no longer answers counts as lost, one that answers again is used again."""
        reports = _unique(list(await asyncio.gather(*(self._fetch(s.address) for s in self.states))))
        stamp = time.strftime("%H:%M:%S")
        self.local = machine.gpus
        for state, report in zip(self.states, reports, strict=True):
            before = state.report
            if before is not None and not report.reachable:
                report = replace(report, name=before.name)  # the name it last reported
            if state.in_use and not report.reachable:
                state.lost += 1
                state.history.append(f"{stamp} lost: {report.error}")
                log.warning("worker %s (%s) lost: %s", report.name, report.address, report.error)
            elif before is not None and not before.reachable and report.reachable:
                state.history.append(f"{stamp} back with {len(report.devices)} device(s)")
                log.info("worker %s (%s) is back", report.name, report.address)
            elif not report.reachable:
                log.warning("worker %s (%s) %s: planning without it", report.name, report.address, report.error)
            state.report = report
            state.in_use = report.reachable
            state.misses = 0
        return merge(machine, reports)

    async def _fetch(self, address: str) -> NodeReport:
        """One worker's report, within ``survey_call_s``; a fetch that raised (a bug, or an answer no check
        foresaw) is a report with the error, so that this worker is planned without and the others still are."""
        try:
            return await asyncio.wait_for(self.fetcher(address, self.api_key), self.survey_call_s)
        except TimeoutError:
            return NodeReport(address, address, error=f"unreachable (no answer within {self.survey_call_s:g} s)")
        except Exception as exc:
            log.exception("surveying worker %s failed", address)
            return NodeReport(address, address, error=f"could not be surveyed ({type(exc).__name__}; see the log)")

    async def check(self) -> list[str]:
        """Ask every node in use whether it is still there (I/O, concurrently, each within
        ``check_call_s``: one that does not answer by then missed this check); the ones now gone."""
        in_use = [s for s in self.states if s.in_use]
        alive = await asyncio.gather(*(self._probe(s.address) for s in in_use))
        for state, answered in zip(in_use, alive, strict=True):
            state.misses = 0 if answered else state.misses + 1
        return gone(self.states)

    async def _probe(self, address: str) -> bool:
        try:
            return await asyncio.wait_for(self.prober(address), self.check_call_s)
        except TimeoutError:
            return False

    def snapshot(self, memory_mib: Mapping[str, Mapping[str, float]] | None = None) -> list[dict[str, Any]]:
        """Each node (this machine first) with its devices and what the live engine placed on each
        (the engine's buffer lines, whose device names carry the RPC endpoint)."""
        memory = dict(memory_mib or {})
        placed_remote: set[str] = set()
        nodes: list[dict[str, Any]] = []
        for state in self.states:
            report = state.report
            devices = []
            for gpu in report.devices if report else ():
                keys = [key for key in memory if gpu.endpoint and gpu.endpoint in key]
                placed_remote.update(keys)
                devices.append(_device(gpu, {k: v for key in keys for k, v in memory[key].items()}))
            nodes.append(
                {
                    "name": report.name if report else state.address,
                    "address": state.address,
                    "state": _state(state),
                    "error": report.error if report else None,
                    "build": report.build if report else "",
                    "ram_available_gib": round((report.ram_available_bytes if report else 0) / GIB, 2),
                    "devices": devices,
                    "lost": state.lost,
                    "history": state.history[-10:],
                }
            )
        head_memory = {key: terms for key, terms in memory.items() if key not in placed_remote}
        head = {
            "name": "head (this machine)",
            "address": "",
            "state": NodeStatus.HEAD,
            "devices": [_device(g, {}) for g in self.local],
            "placed_mib": head_memory,  # the engine's own names: CUDA0…, CPU
        }
        return [head, *nodes]


def _state(state: NodeState) -> NodeStatus:
    if state.report is None:
        return NodeStatus.NOT_SURVEYED
    if state.report.reachable:
        return NodeStatus.IN_USE if state.in_use else NodeStatus.AVAILABLE
    return NodeStatus.LOST if state.lost else NodeStatus.UNREACHABLE


def _device(gpu: Device, placed: Mapping[str, float]) -> dict[str, Any]:
    return gpu.to_json() | {"endpoint": gpu.endpoint, "link": gpu.link, "placed_mib": dict(placed)}
