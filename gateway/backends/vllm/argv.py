"""`vllm serve` argv and environment: the one place vLLM's flag names live (never the removed --swap-space)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from gateway.backends.vllm.memory import VllmFlags
from gateway.backends.vllm.scheduling import long_prefill_threshold

HEALTH_PATH = "/health"


def build_argv(
    checkpoint: str,
    flags: VllmFlags,
    *,
    served_name: str,
    tool_call_parser: str | None,
    reasoning_parser: str | None,
    port: int | None = None,
    command: list[str] | None = None,
    pipeline_parallel_size: int = 1,
    data_parallel: Sequence[str] = (),
) -> list[str]:
    """argv for one configuration; PORT stands in for the port when none is given yet. Pipeline
    stages over nodes run on vLLM's own launcher (``mp``; gateway/backends/vllm/multinode.py adds the ranks)."""
    prefix = command or ["vllm", "serve"]
    if prefix[-1] == "serve":  # `vllm serve MODEL`; the api_server module takes `--model MODEL`
        argv = [*prefix, checkpoint, "--served-model-name", served_name]
    else:
        argv = [*prefix, "--model", checkpoint, "--served-model-name", served_name]
    argv += ["--tensor-parallel-size", str(flags.tensor_parallel_size), *data_parallel]
    if pipeline_parallel_size > 1:
        argv += ["--pipeline-parallel-size", str(pipeline_parallel_size), "--distributed-executor-backend", "mp"]
    if flags.kv_cache_memory_bytes is not None:
        argv += ["--kv-cache-memory-bytes", str(flags.kv_cache_memory_bytes)]
    else:
        argv += ["--gpu-memory-utilization", str(flags.gpu_memory_utilization)]
    argv += ["--max-model-len", str(flags.max_model_len), "--max-num-seqs", str(flags.max_num_seqs)]
    argv += ["--max-num-batched-tokens", str(flags.max_num_batched_tokens)]
    # many agents at once (gateway/backends/vllm/scheduling.py): warm turns before long prefills, which share each step
    argv += ["--scheduling-policy", "priority"]
    argv += [
        "--long-prefill-token-threshold",
        str(long_prefill_threshold(flags)),
    ]
    if flags.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", flags.kv_cache_dtype]
    if flags.block_size:  # prefix caching reuses whole blocks only
        argv += ["--block-size", str(flags.block_size)]
    if flags.enable_prefix_caching:  # off by default for hybrid models before 0.26 (warm_turns.py)
        argv.append("--enable-prefix-caching")
    if flags.prefix_match_unit:  # a hybrid's prefix hits inside its large blocks (warm_turns.py)
        argv += ["--prefix-match-unit", str(flags.prefix_match_unit)]
    if flags.enforce_eager:
        argv.append("--enforce-eager")
    if flags.cpu_offload_gb:
        argv += ["--cpu-offload-gb", f"{flags.cpu_offload_gb:g}"]
    if flags.speculative_mtp:  # the model's own MTP layers draft tokens (no second model)
        config = {"method": "mtp", "num_speculative_tokens": flags.speculative_mtp}
        argv += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    if flags.language_model_only:  # text only: the vision/audio towers are neither loaded nor profiled
        argv.append("--language-model-only")
    if tool_call_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
    if reasoning_parser:
        argv += ["--reasoning-parser", reasoning_parser]
    # prefix caching is on by default; this makes usage say how much of each prompt it served
    # (prompt_tokens_details.cached_tokens), which the gateway reports in every dialect
    argv.append("--enable-prompt-tokens-details")
    return [*argv, "--host", "127.0.0.1", "--port", str(port) if port else "PORT"]  # key: see build_env


def build_env(*, on_cpu: bool = False, api_key: str | None = None) -> dict[str, str]:
    """The key in VLLM_API_KEY, never on argv (any local user can read /proc/PID/cmdline)."""
    env = {"PYTORCH_ALLOC_CONF": "expandable_segments:True", "VLLM_NO_USAGE_STATS": "1"}
    env |= {"VLLM_HOST_IP": "127.0.0.1"} if on_cpu else {}
    return env | ({"VLLM_API_KEY": api_key} if api_key else {})
