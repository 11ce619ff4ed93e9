"""States and capabilities are enums whose values are the wire's words: what crosses JSON stays byte-identical,
and what comes back over HTTP is read into the enum at the boundary."""

from __future__ import annotations

import json

from gateway.backends.base import Capability
from gateway.nodes.start_request import FollowerState
from gateway.serving.metrics import _node_metrics
from gateway.supervision.lifecycle import NodeStatus


def test_the_wire_words_are_unchanged() -> None:
    assert json.dumps({"state": FollowerState.RUNNING, "node": NodeStatus.IN_USE}) == (
        '{"state": "running", "node": "in use"}'
    )
    assert f"/v1/{Capability.MESSAGES}" == "/v1/messages"


def test_a_workers_answer_is_read_into_the_follower_state() -> None:
    assert FollowerState.read("exited") is FollowerState.EXITED
    assert FollowerState.read("sleeping") is None and FollowerState.read(None) is None


def test_node_up_reads_the_snapshot_as_it_came_over_json() -> None:
    """/status' nodes read back from JSON (plain strings) still count as in use."""
    snapshot = json.loads(
        json.dumps(
            {
                "nodes": [
                    {"name": "head (this machine)", "address": "", "state": NodeStatus.HEAD},
                    {"name": "a", "address": "10.0.0.2:8100", "state": NodeStatus.IN_USE, "lost": 0},
                    {"name": "b", "address": "10.0.0.3:8100", "state": NodeStatus.LOST, "lost": 2},
                ]
            }
        )
    )
    up = next(family for family in _node_metrics(snapshot) if family.name == "gateway_node_up")
    assert {sample.labels["node"]: sample.value for sample in up.samples} == {"a": 1.0, "b": 0.0}
