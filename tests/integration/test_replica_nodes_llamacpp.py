"""`serve --replicas 2` over two network-namespace nodes on llama-server, for real (issue 50): the head's
replica on its CPU, the other a whole llama-server that node-b's worker runs on the head's word; the
worker node is killed mid-stream and comes back (tests/integration/replica_nodes.py has the scenario).
Two llama-servers of the embedded default, one thread each: about a minute here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.netns import unavailable
from tests.integration.replica_nodes import Nodes, serve_and_lose_a_node, two_nodes

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

MODEL = "smollm2-135m-instruct"
STALL_S = 20


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf: Path) -> Iterator[Nodes]:
    if why := unavailable():
        pytest.skip(f"cannot make network namespaces here: {why}")
    workdir = tmp_path_factory.mktemp("replica-nodes-llamacpp")
    serve = ("--context-length", "2048", "--stall-timeout", str(STALL_S))
    with two_nodes(workdir, MODEL, ("--cpu-memory", "4GiB"), serve, {}, ready_s=300) as started:
        yield started


def test_two_replicas_on_two_nodes_serve_and_a_lost_node_is_served_around_and_returns(nodes: Nodes) -> None:
    serve_and_lose_a_node(nodes, stall_s=STALL_S, back_s=180)
    assert "replica 2 (node node-b)" in nodes.log("head")
