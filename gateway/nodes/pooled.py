"""The machine a plan pools: this node's devices with the other nodes', simulated (``--remote-gpus``)
or as the workers report them now (``--workers``), and the key the head sends those workers."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from gateway.core.devices import Inventory, parse_remote_gpus
from gateway.core.settings import Settings
from gateway.nodes.survey import Nodes


def worker_key(settings: Settings, keys: tuple[str, ...]) -> str | None:
    """What the head sends its workers: worker_api_key, else its own first key (``keys``: as read once)."""
    return settings.worker_api_key or (keys[0] if keys else None)


def with_other_nodes(
    machine: Inventory, settings: Settings, remote_spec: str | None = None, nodes: Nodes | None = None
) -> Inventory:
    """This machine plus the other nodes' devices: simulated (``--remote-gpus``), else what the workers
    report now (``--workers``; one that does not answer is left out, and the notes say so). For the callers
    that run before any event loop (``plan``, ``serve``'s first plan): the survey is run to its end here."""
    if remote_spec:
        remote = parse_remote_gpus(remote_spec)
        names = sorted({g.node for g in remote})
        return replace(machine, remote=remote, notes=(*machine.notes, f"simulated devices on {', '.join(names)}"))
    if nodes is None and settings.workers:
        nodes = Nodes(settings.workers, worker_key(settings, settings.read_api_keys()))
    return asyncio.run(nodes.survey(machine)) if nodes is not None else machine
