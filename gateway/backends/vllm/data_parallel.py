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
- Balancing: internal (``--data-parallel-size N`` with ``--data-parallel-size-local``, ``--headless`` on
  nodes without an API server): the head's API servers spread requests over the ranks by their queues
  alone; hybrid (``--data-parallel-hybrid-lb``, or ``--data-parallel-start-rank``): one API server per
  node over its own ranks, as internal; external (``--data-parallel-rank R``, one API server per rank,
  ``vllm/entrypoints/cli/serve.py:114``: ``api_server_count`` 1 for it): whoever is in front chooses the rank.
  ``--data-parallel-multi-port-external-lb`` is external with one supervisor per node (0.32.0 only:
  ``vllm/entrypoints/launchers/dp_supervisor.py``). With external ranks every process sees its own
  GPUs from 0 (``data_parallel_size_local`` 1), so ``CUDA_VISIBLE_DEVICES`` gives each its share, and all
  meet at ``--data-parallel-address`` (rank 0's node) on ``--data-parallel-rpc-port`` (default 29550,
  ``vllm/config/parallel.py:160``; the same on every node).

Which case gets which here:

- **Replicas that each hold the whole model** (dense or MoE): one ordinary ``vllm serve`` per replica, no
  data-parallel flags, its GPUs through ``CUDA_VISIBLE_DEVICES`` (on the head; on a worker node, the whole
  engine there). Each has its own fate, and the gateway puts each session on the replica that holds its
  cache; vLLM's own balancers look only at queues.
- **A MoE on one node whose ranks hold it better with the experts spread over all of them** (it meets the
  floor only so, or keeps more sessions warm: a 4-GPU node where each GPU holds a quarter of the experts
  and a whole KV cache, where tensor parallelism would copy an MLA model's cache onto every GPU): one
  data-parallel group, each rank launched on its own as an external rank (``--data-parallel-size N
  --data-parallel-rank R --enable-expert-parallel``, its GPUs through ``CUDA_VISIBLE_DEVICES``, all ranks
  meeting on 127.0.0.1 at the default ``--data-parallel-rpc-port``), so the gateway still routes each
  session to one rank's API server; the ranks share one fate. The plan takes the group only where it meets
  the floor or keeps more sessions warm than replicas of their own (gateway/planning/replicas.py): its
  decode estimate leaves out the steps a rank waits for the others.
- **A group across nodes** (``--data-parallel-address`` of rank 0's node and one ``--data-parallel-rpc-port``
  on every node; ``--data-parallel-size-local`` with ``--headless`` or ``--data-parallel-hybrid-lb`` for
  vLLM's own balancing): not planned. Ranks that share experts exchange every token twice per MoE layer (47
  layers of GLM-4.7-Flash: 94 crossings a step, ~24 ms at a LAN's 0.5 ms round trip, where pipeline stages
  cross twice); and internal, hybrid or headless balancing would put vLLM's queue-only choice between the
  gateway and the ranks' caches. Across nodes the plan weighs replicas of their own, or one engine with
  pipeline stages (gateway/backends/vllm/multinode.py).
- **A dense model**: never a group (refused by the release, and no gain).
"""

from __future__ import annotations

import dataclasses

from gateway.backends.base import RANK
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
    """One external rank's flags on the group's node; ``RANK`` stands for its index (filled per replica).
    The ranks meet on 127.0.0.1 at the release's default ``--data-parallel-rpc-port`` (29550)."""
    return ["--data-parallel-size", str(ranks), "--data-parallel-rank", RANK, "--enable-expert-parallel"]
