"""vLLM's own data parallelism, and which replicas get it (issue 50), read from vLLM 0.32.0's source.

What the release does:

- A dense model's data-parallel ranks are independent engines: ``vllm/v1/engine/core.py:1473-1478``
  (``run_engine_core``) runs a ``DPEngineCoreProc`` only ``if data_parallel and model_config.is_moe``,
  else "Non-MoE DP ranks are completely independent, so treat like DP=1". Launched one per rank behind
  an outside balancer (``--data-parallel-rank``), a dense model is refused:
  ``vllm/engine/arg_utils.py:2421`` "Non-MoE models do not support external data parallel mode. For
  external load balancing, launch independent vLLM instances without --data-parallel-* arguments."
- A MoE's ranks are one engine group: the expert layers form one group over all DP × TP GPUs
  (``vllm/model_executor/layers/fused_moe/config.py`` ``FusedMoEParallelConfig.make``:
  ``flatten_tp_across_dp_and_pcp``; with ``--enable-expert-parallel`` each GPU owns 1/(DP·TP) of the
  experts whole, else a 1/(DP·TP) slice of each), so every rank steps with the others (the DP coordinator's
  waves, ``enable_wave_coordination=model_config.is_moe`` at ``vllm/v1/engine/utils.py:1234``; an idle rank
  runs dummy batches) and the group lives or dies as one.
- Balancing, as ``vllm/entrypoints/cli/serve.py:79-126`` and ``vllm/engine/arg_utils.py:2380-2500`` sort the flags:

  - **internal** (``--data-parallel-size N``; ``--data-parallel-size-local`` defaults to N on one node, and to
    what ``--nnodes`` gives otherwise): one ``vllm serve`` starts every local rank (rank i runs on the visible
    GPUs ``[i·TP, (i+1)·TP)``: ``get_physical_gpu_ids_for_local_dp_rank``, ``vllm/v1/engine/utils.py:433``) and N
    API server processes on one port, whose clients send each request to the least loaded rank
    (``DPLBAsyncMPClient.get_core_engine_for_request``, ``vllm/v1/engine/core_client.py:1642``: waiting +
    running, nothing of its prompt) unless the request names one in the ``X-data-parallel-rank`` header
    (``vllm/entrypoints/generate/base/serving.py:225``). On one node the ranks meet over IPC
    (``handshake_local_only``, ``vllm/v1/engine/utils.py:1307``) and the torch group's ports are free ones
    found at start (``get_open_ports_list``, ``vllm/config/parallel.py:993``): no port to choose.
  - **across nodes, internal**: the head runs ``--data-parallel-size N --data-parallel-size-local L
    --data-parallel-address <head> --data-parallel-rpc-port P``; every other node runs its ranks with
    ``--headless --data-parallel-start-rank S`` (engine cores, no API server), the same address and port
    (default 29550, ``vllm/config/parallel.py:160``).
  - **hybrid** (``--data-parallel-hybrid-lb``, or ``--data-parallel-start-rank`` without ``--headless``): an
    API server on every node over its own ranks, a balancer in front across nodes.
  - **external** (``--data-parallel-rank R``, one API server per rank, ``api_server_count`` 1): whoever is in
    front chooses the rank; each process sees its own GPUs from 0 (``--data-parallel-size-local`` 1).
    ``--data-parallel-multi-port-external-lb`` is external with one supervisor per node
    (``vllm/entrypoints/launchers/dp_supervisor.py``).
- ``--enable-expert-parallel``: each GPU of the group owns 1/(DP·TP) of the experts whole instead of a slice
  of each (the memory this module's :func:`expert_sharded` gives a rank).

Which case gets which here:

- **Replicas that each hold the whole model** (dense or MoE): one ordinary ``vllm serve`` per replica, no
  data-parallel flags, its GPUs through ``CUDA_VISIBLE_DEVICES`` (on the head; on a worker node, the whole
  engine there). Each has its own fate, and the gateway puts each session on the replica that holds its
  cache; vLLM's own balancers look only at queues.
- **A MoE on one node whose ranks hold it better with the experts spread over all of them** (it meets the
  floor only so, or keeps more sessions warm: each GPU holds a share of the experts and a whole KV cache,
  where tensor parallelism would copy an MLA model's cache onto every GPU): ONE engine, internal balancing
  (:func:`group_args`: ``--data-parallel-size N --data-parallel-size-local N --enable-expert-parallel``), over
  every rank's GPUs through ``CUDA_VISIBLE_DEVICES``: one process tree, one port, one fate (the ranks step
  together and die together anyway). Each rank is still a replica for the gateway's router: its requests
  carry :func:`rank_headers`, so a session's turns reach the rank that holds its prefix, where vLLM's own
  front end would pick the shortest queue each time. The plan takes the group only where it meets the floor
  or keeps more sessions warm than replicas of their own (gateway/planning/replicas.py): its decode estimate
  leaves out the steps a rank waits for the others.
- **A group across nodes** (internal with ``--headless`` ranks on the workers, or hybrid): not planned, so
  not started. Ranks that share experts exchange every token twice per MoE layer (47 layers of
  GLM-4.7-Flash: 94 crossings a step, ~24 ms at a LAN's 0.5 ms round trip, where pipeline stages cross
  twice); across nodes the plan weighs replicas of their own, or one engine with pipeline stages
  (gateway/backends/vllm/multinode.py).
- **A dense model**: never a group (its ranks are independent engines: replicas of their own do the same with
  the gateway's routing; launched rank by rank the release refuses it).
"""

from __future__ import annotations

import dataclasses

from gateway.backends.vllm.estimate import expert_fraction
from gateway.backends.vllm.memory import Checkpoint


def expert_sharded(checkpoint: Checkpoint, ranks: int) -> Checkpoint:
    """One rank's share of a MoE checkpoint in a group of ``ranks``: its own copy of everything but the
    routed experts, and 1/ranks of those (tensor parallelism then splits what the rank holds)."""
    facts = checkpoint.facts
    experts = expert_fraction(facts)
    kept = int(facts.weight_bytes * (1 - experts * (1 - 1 / ranks)))
    return Checkpoint(checkpoint.name, dataclasses.replace(facts, weight_bytes=kept))


def group_args(ranks: int) -> list[str]:
    """The flags of one engine that runs a group of ``ranks`` on this node, its own front end spreading the
    requests (internal balancing): each rank takes the next TP GPUs of those the engine sees."""
    return ["--data-parallel-size", str(ranks), "--data-parallel-size-local", str(ranks), "--enable-expert-parallel"]


def rank_headers(rank: int) -> dict[str, str]:
    """A request for ``rank`` of the group: vLLM's front end sends it there instead of to the shortest queue
    (``vllm/entrypoints/generate/base/serving.py:225``, honoured by chat completions, completions and
    Anthropic messages), so the gateway's router keeps each session on the rank that holds its prefix."""
    return {"X-data-parallel-rank": str(rank)}
