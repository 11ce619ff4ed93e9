"""vLLM across nodes, planned only (issue 13): TP inside each node, pipeline stages across nodes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from backends import vllm
from backends.base import Installation
from backends.vllm import multinode
from gateway.cli.full_settings import Settings
from gateway.core.devices import GIB, Device, Inventory
from gateway.core.policy import Policy
from gateway.planning.catalog import builtin_catalog
from gateway.planning.plan_report import render
from gateway.planning.planner import Plan, evaluate_and_choose
from tests.unit.plan_helpers import engine_plans


def _gpus(count: int, node: str = "", gib: int = 24) -> tuple[Device, ...]:
    endpoint = f"{node}.lan:5005" if node else ""
    return tuple(
        Device(i, f"RTX 4090 {node or 'here'}", gib * GIB, gib * GIB, (8, 9), node=node, endpoint=endpoint)
        for i in range(count)
    )


def _inventory(local: int, *remote: tuple[str, int]) -> Inventory:
    others = tuple(gpu for node, count in remote for gpu in _gpus(count, node))
    return Inventory(_gpus(local), 128 * GIB, 128 * GIB, source="simulated", remote=others)


def _plan(inventory: Inventory) -> Plan:
    # the BF16 checkpoint only: the NVFP4 one runs on one node of 4090s (ModelOpt NVFP4 needs 7.5)
    checkpoints = vllm.BACKEND.read(builtin_catalog().resolve("glm-4.7-flash")).checkpoints[:1]
    engines = engine_plans("glm-4.7-flash", checkpoints=checkpoints, parsers=("glm47", "glm45"))
    return evaluate_and_choose("glm-4.7-flash", engines, inventory, Policy())


def _across(plan: Plan) -> list[vllm.VllmCandidate]:
    return [c for c in plan.candidates_of("vllm") if c.planned_only]


def test_tp_inside_each_node_and_pipeline_stages_across_nodes_hold_what_one_node_cannot() -> None:
    plan = _plan(_inventory(2, ("node2", 2)))
    single = [c for c in plan.candidates_of("vllm") if not c.planned_only]
    assert single and not any(c.fits for c in single)  # 27.9 GiB of BF16 weights per GPU at TP2
    across = [c for c in _across(plan) if c.fits]
    assert across and all(c.flags.tensor_parallel_size == 2 and c.pipeline_parallel_size == 2 for c in across)
    best = max(across, key=lambda c: c.context_length)
    assert 13 * GIB < best.memory.weights < 16 * GIB  # a quarter of the weights plus one vocabulary matrix
    assert best.context_length >= 32768 and best.nodes == ("node2",)


def test_the_argv_and_steps_are_exact_and_nothing_is_started() -> None:
    plan = _plan(_inventory(2, ("node2", 2), ("node3", 2)))
    best = next(c for c in _across(plan) if c.fits)
    argv = best.argv
    assert argv[:3] == ["vllm", "serve", "zai-org/GLM-4.7-Flash"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "3"
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
    join = (
        'v=$(vllm --version 2>/dev/null | tail -n 1); if [ "$v" = {v} ]; then ray start --address HEAD:6379; '
        "else echo '{node} has vLLM '\"$v\"', the head {v}: install vllm=={v}' >&2; false; fi"
    )
    assert best.steps == [
        "on this machine (HEAD): ray start --head --port 6379",
        "on node2: " + join.format(node="node2", v=vllm.DEFAULT_VERSION),
        "on node3: " + join.format(node="node3", v=vllm.DEFAULT_VERSION),
        'on this machine (HEAD): VLLM_API_KEY="$GATEWAY_API_KEY" '
        + " ".join("8001" if word == "PORT" else word for word in argv),
        "on this machine (HEAD): gateway serve --backend-url http://127.0.0.1:8001 "
        '--backend-api-key "$GATEWAY_API_KEY" --backend-native-apis '
        "responses,messages,include_usage,max_completion_tokens",
    ]
    assert "planned only" in best.reason and best.to_json()["steps"] == best.steps
    assert plan.chosen is not best and best not in vllm.BACKEND.ranked(plan.candidates_of("vllm"))
    text = render(plan)
    assert "vLLM across nodes (planned only" in text and "then ray start --address HEAD:6379" in text
    installed = Installation(("vllm", "serve"), "0.32.0", "given")
    model = vllm.BACKEND.read(builtin_catalog().resolve("glm-4.7-flash"))
    engine = plan.engine("vllm")
    assert engine is not None
    options = vllm.BACKEND.options(model, engine.evaluation, Policy(), installed, Settings())
    assert options == []  # serve never starts it


def test_no_plan_across_nodes_with_unequal_gpu_counts_or_when_one_node_suffices() -> None:
    assert multinode.node_layout(_inventory(2, ("node2", 1))) is None
    assert not _across(_plan(_inventory(2, ("node2", 1))))
    assert multinode.node_layout(_inventory(2)) is None
    roomy = Inventory(_gpus(2, gib=80), 128 * GIB, 128 * GIB, source="simulated", remote=_gpus(2, "node2", 80))
    assert not _across(_plan(roomy))


def _fake(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)


@pytest.mark.parametrize(("worker_version", "joins"), [("0.32.0", True), ("0.31.1", False), (None, False)])
def test_a_worker_joins_ray_only_with_the_heads_vllm_and_says_why_not(
    tmp_path: Path, worker_version: str | None, joins: bool
) -> None:
    """The pasted join line run by a real shell, with stand-ins for `vllm` (which logs its platform to
    stdout before the version) and `ray`; a worker without vLLM has no `vllm` at all. Ray itself would
    let a node with another vLLM join (it compares only its own and Python's versions)."""
    _fake(tmp_path, "ray", f'echo "$@" > {tmp_path}/ray-args')
    if worker_version:
        platform = "echo 'INFO [__init__.py:216] Automatically detected platform cuda.'"
        _fake(tmp_path, "vllm", f"{platform}; echo {worker_version}")
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    line = multinode.join("node2", "0.32.0")
    done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, env=env, timeout=10, check=False)
    ray_args = tmp_path / "ray-args"
    if joins:
        assert done.returncode == 0 and ray_args.read_text().split() == ["start", "--address", "HEAD:6379"]
    else:
        assert done.returncode != 0 and not ray_args.exists()
        assert done.stderr.strip() == f"node2 has vLLM {worker_version or ''}, the head 0.32.0: install vllm==0.32.0"
