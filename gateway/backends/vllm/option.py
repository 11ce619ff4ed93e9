"""A vLLM configuration the supervisor can start, retry on the engine's numbers, and remember."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, get_type_hints

from pydantic import TypeAdapter

from gateway.backends.base import Capability, Failure, Follower, Launch
from gateway.backends.vllm.argv import HEALTH_PATH, build_argv, build_env
from gateway.backends.vllm.data_parallel import group_args
from gateway.backends.vllm.group import GroupPlan
from gateway.backends.vllm.logs import adjust, classify
from gateway.backends.vllm.memory import DEFAULT_VERSION, VllmFlags
from gateway.backends.vllm.multinode import group_argv, group_env, rank_args
from gateway.backends.vllm.progress import PROGRESS_PATH, metrics_progress
from gateway.backends.vllm.scheduling import scheduling
from gateway.backends.vllm.speed import METRICS_PATH, speed_totals
from gateway.core.process import free_port

ENGINE = "vllm"
NATIVE_APIS = frozenset(
    {
        Capability.RESPONSES,
        Capability.MESSAGES,
        Capability.INCLUDE_USAGE,
        Capability.MAX_COMPLETION_TOKENS,
        Capability.OPENAI_SHAPES,
        Capability.STREAM_KEEPALIVE,
    }
)

# each flag's declared type, to read remembered flags back with (a hand-edited or older file may say otherwise)
_FLAG_TYPES = {name: TypeAdapter(kind) for name, kind in get_type_hints(VllmFlags).items()}


@dataclass(frozen=True)
class VllmOption:
    checkpoint: str
    flags: VllmFlags
    served_name: str
    command: tuple[str, ...]
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    min_context: int = 1
    version: str = DEFAULT_VERSION
    on_cpu: bool = False
    estimated_tokens_per_s: float = 0.0  # the plan's decode estimate (gateway/backends/vllm/estimate.py)
    engine: str = ENGINE
    # across nodes: one pipeline stage per node, rank 0 here and the others through the nodes' workers
    group: GroupPlan | None = None
    pipeline_parallel_size: int = 1
    # a data-parallel group of a MoE on one node, this many ranks each as planned (backends/vllm/data_parallel.py):
    # ONE `vllm serve` over every rank's GPUs, whose own front end spreads the requests over the ranks
    data_parallel: int = 1

    @property
    def label(self) -> str:
        f = self.flags
        parts = [
            f"vLLM {self.version}",
            "CPU" if self.on_cpu else f"TP{f.tensor_parallel_size}",
            f"--max-model-len {f.max_model_len}",
        ]
        if self.group is not None:
            parts.insert(2, f"PP{self.pipeline_parallel_size} over this machine and {', '.join(self.group.nodes)}")
        if self.data_parallel > 1:
            parts.insert(2, f"DP{self.data_parallel} with EP")
        parts.append(
            f"--kv-cache-memory-bytes {f.kv_cache_memory_bytes}"
            if f.kv_cache_memory_bytes
            else f"util {f.gpu_memory_utilization}"
        )
        parts.append(f"{f.max_num_seqs} seqs")
        if f.enforce_eager:
            parts.append("eager")
        if f.kv_cache_dtype != "auto":
            parts.append(f"{f.kv_cache_dtype} KV")
        return ", ".join(parts)

    @property
    def context_length(self) -> int:
        return self.flags.max_model_len

    @property
    def weights_key(self) -> tuple[object, ...]:
        """Options sharing this key load the same weights per GPU: one weights OOM rules them all out."""
        return (
            self.checkpoint,
            self.flags.tensor_parallel_size,
            self.pipeline_parallel_size,
            self.flags.cpu_offload_gb,
            self.data_parallel,
        )

    def launch(self, port: int, api_key: str) -> Launch:
        argv = build_argv(
            self.checkpoint,
            self.flags,
            served_name=self.served_name,
            tool_call_parser=self.tool_call_parser,
            reasoning_parser=self.reasoning_parser,
            port=port,
            command=list(self.command),
            pipeline_parallel_size=self.pipeline_parallel_size if self.group is not None else 1,
            data_parallel=group_args(self.data_parallel) if self.data_parallel > 1 else (),
        )
        env = build_env(on_cpu=self.on_cpu, api_key=api_key)
        followers: tuple[Follower, ...] = ()
        if (group := self.group) is not None:
            master = free_port()
            stages = self.pipeline_parallel_size
            argv = group_argv(argv, nnodes=stages, rank=0, master_addr=group.head_address, master_port=master)
            env |= group_env(group.head_address, group.head_interface)
            followers = self._followers(group, master, port)
        return Launch(
            engine=ENGINE,
            argv=argv,
            port=port,
            api_key=api_key,
            served_name=self.served_name,
            context_length=self.flags.max_model_len,
            health_path=HEALTH_PATH,
            summary=self.label,
            env=env,
            inherit=("VLLM_",),  # vLLM's own knobs (VLLM_CPU_KVCACHE_SPACE...) reach it
            max_concurrency=self.flags.max_num_seqs,
            native=NATIVE_APIS,
            reasoning_field="reasoning",
            tokenize_path="/tokenize",
            tokenize_key="prompt",
            tokenize_chat=True,
            speed_metrics=speed_totals,
            metrics_path=METRICS_PATH,
            scheduling=scheduling(self.flags, on_cpu=self.on_cpu),
            progress_path=PROGRESS_PATH,
            progress=metrics_progress,
            followers=followers,
        )

    def _followers(self, group: GroupPlan, master_port: int, port: int) -> tuple[Follower, ...]:
        """The group's other ranks, one per node after the head's, each with the arguments that node's worker
        puts after its own vLLM command (the head is rank 0, at ``master_port``)."""
        return tuple(
            Follower(
                node,
                rank,
                ENGINE,
                self.version,
                rank_args(
                    self.flags,
                    self.checkpoint,
                    served_name=self.served_name,
                    tool_call_parser=self.tool_call_parser,
                    reasoning_parser=self.reasoning_parser,
                    stages=self.pipeline_parallel_size,
                    rank=rank,
                    master_addr=group.head_address,
                    master_port=master_port,
                    port=port,
                ),
            )
            for rank, node in enumerate(group.nodes, 1)
        )

    def classify(self, line: str) -> Failure | None:
        return classify(line)

    def step_down(self, failure: Failure) -> VllmOption | None:
        adjusted = adjust(self.flags, failure, min_context=self.min_context)
        return replace(self, flags=adjusted) if adjusted else None

    def memo(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "flags": asdict(self.flags), "on_cpu": self.on_cpu}

    def prepare(self) -> VllmOption:
        return self  # vLLM fetches its own weights

    def from_memo(self, memo: dict[str, Any]) -> VllmOption:
        checkpoint, on_cpu = memo["checkpoint"], memo.get("on_cpu", False)
        if not isinstance(checkpoint, str) or not isinstance(on_cpu, bool):
            raise TypeError(f"checkpoint {checkpoint!r} or on_cpu {on_cpu!r} of the wrong type")
        return replace(self, checkpoint=checkpoint, flags=_remembered_flags(memo["flags"]), on_cpu=on_cpu)


def _remembered_flags(remembered: dict[str, Any]) -> VllmFlags:
    """Remembered flags, each checked against its declared type as it is read (a field unknown or missing:
    TypeError; of another type: ValueError), not found wrong when the engine is launched."""
    flags = VllmFlags(**remembered)
    for name, kind in _FLAG_TYPES.items():
        kind.validate_python(getattr(flags, name), strict=True)
    return flags
