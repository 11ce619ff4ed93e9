"""What llama.cpp's KV cache takes per layer: cells, bytes per token, sliding windows, recurrent states.

Follows llama.cpp build 11434 (``llama-server``) as measured on RPC devices
(``benchmarks/llamacpp_placement.py``; the logs replayed in tests/unit/test_llamacpp_placement.py): one
cache of n_ctx cells shared by the slots (``--kv-unified``); a sliding-window layer keeps
``slots × window + ubatch`` cells (every slot its window), padded to 256, at most n_ctx, where the
launcher keeps a window per slot; a recurrent layer keeps a fixed state per slot instead.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import gateway.backends.llamacpp.drafting as drafting
from gateway.backends.llamacpp.gguf_facts import SWA_PATTERN, GgufFacts
from gateway.backends.llamacpp.launcher import UBATCH, Launcher

KV_TYPES = {"f16": (2.0, 1), "q8_0": (34 / 32, 8), "q4_0": (18 / 32, 2)}  # bytes/element, ggml type id
KV_PAD = 256  # llama.cpp pads cache sizes to 256 cells
F32 = 4


def recurrent_state_bytes(facts: GgufFacts, sequences: int, draft: str | None = None) -> int:
    """One recurrent layer's states (llama_memory_recurrent, f32): ``n_embd_r`` (conv: (kernel − 1) ×
    (inner + 2 groups × state)) and ``n_embd_s`` (state × inner) per row; a row per sequence (the
    launcher's slots), times 1 + the drafted tokens with MTP (``n_rs_seq``: common.h need_n_rs_seq,
    ``--spec-draft-n-max`` 3)."""
    if facts.recurrent_kind == "gated_delta_net":
        k_heads, v_heads, k_dim, v_dim, kernel = facts.recurrent_dims
        inner, groups, state = v_heads * v_dim, k_heads, k_dim
    elif facts.recurrent_kind == "mamba2":
        inner, groups, _, _, state, kernel = facts.recurrent_dims
    else:
        return 0
    per_row = (kernel - 1) * (inner + 2 * groups * state) + state * inner
    rows = sequences * (1 + (drafting.MTP_DRAFT_TOKENS if draft == "mtp" else 0))
    return per_row * F32 * rows


def kv_bytes_per_token_layer(facts: GgufFacts, kv_type: str, layer: int) -> float:
    """K and V of one token in ``layer`` (MLA: the 576-element latent only, recent builds). Layers
    differ where the GGUF says so (llama.cpp's ``n_embd_k_gqa(il)``): per-layer KV head counts and,
    for sliding layers, their own head sizes (Gemma 4: 16 × (256 + 256) sliding, 4 × (512 + 512)
    full); layers that reuse an earlier layer's cache (``shared_kv_layers``) store nothing."""
    size = KV_TYPES[kv_type][0]
    if facts.is_recurrent(layer):  # a fixed state instead (recurrent_state_bytes)
        return 0.0
    if facts.is_mla:
        return (facts.kv_lora_rank + facts.qk_rope_head_dim) * size
    if facts.shared_kv_layers and layer >= facts.num_layers - facts.shared_kv_layers:
        return 0.0
    heads = facts.kv_heads_per_layer[layer] if facts.kv_heads_per_layer else facts.num_kv_heads
    key = facts.cache_key_dim or facts.head_dim
    value = facts.cache_value_dim or facts.head_dim
    if facts.cache_key_dim_sliding and is_sliding(facts, layer):
        key, value = facts.cache_key_dim_sliding, facts.cache_value_dim_sliding or facts.cache_key_dim_sliding
    return heads * (key + value) * size


def is_sliding(facts: GgufFacts, layer: int) -> bool:
    """Whether block ``layer`` uses the sliding window: the GGUF's per-layer pattern when it has one
    (Gemma 4), else llama.cpp's per-architecture pattern."""
    if not facts.sliding_window:
        return False
    if facts.sliding_per_layer:
        return facts.sliding_per_layer[layer]
    pattern = SWA_PATTERN.get(facts.model_type)
    if pattern is None:
        return layer < facts.sliding_layers
    return layer % pattern < pattern - 1


@lru_cache(maxsize=64)
def sliding_pattern(facts: GgufFacts) -> tuple[bool, ...]:
    """:func:`is_sliding` for every block, worked out once per model (the placement search needs it
    for every device of every placement it tries)."""
    return tuple(is_sliding(facts, layer) for layer in range(facts.num_layers))


def kv_cells(facts: GgufFacts, layer: int, n_ctx: int, launcher: Launcher) -> int:
    """Cells of one layer's cache. The native server keeps, for a sliding-window layer, every slot's
    window plus a ubatch in one unified cache (2,560 cells for Gemma 3's 512 with -np 4, as logged);
    llama-cpp-python keeps the full-size SWA cache."""
    cap = _window_cells(facts, layer, launcher)
    return n_ctx if cap is None else min(n_ctx, cap)


def _window_cells(facts: GgufFacts, layer: int, launcher: Launcher) -> int | None:
    """The cells a sliding-window layer keeps whatever the context (:func:`kv_cells`); None: the context's."""
    if launcher.window_per_slot and is_sliding(facts, layer):
        assert facts.sliding_window
        window = facts.sliding_window * launcher.slots + UBATCH
        return -(-window // KV_PAD) * KV_PAD
    return None


class _LayerKv(NamedTuple):
    """What one layer's cache costs apart from the context: bytes per cell (None for a recurrent layer), the
    cells a sliding window caps it at, and a recurrent layer's states."""

    per_cell: float | None
    window_cells: int | None
    states: int

    def bytes_at(self, n_ctx: int) -> int:
        if self.per_cell is None:
            return self.states
        return int((n_ctx if self.window_cells is None else min(n_ctx, self.window_cells)) * self.per_cell)


def _layer_kv(facts: GgufFacts, layer: int, kv_type: str, launcher: Launcher, draft: str | None) -> _LayerKv:
    if facts.is_recurrent(layer):
        return _LayerKv(None, None, recurrent_state_bytes(facts, launcher.slots, draft))
    return _LayerKv(kv_bytes_per_token_layer(facts, kv_type, layer), _window_cells(facts, layer, launcher), 0)


def kv_layer_bytes(
    facts: GgufFacts, layer: int, kv_type: str, n_ctx: int, launcher: Launcher, draft: str | None = None
) -> int:
    """One layer's KV cache, or a recurrent layer's states."""
    return _layer_kv(facts, layer, kv_type, launcher, draft).bytes_at(n_ctx)


def kv_bytes_by_layer(
    facts: GgufFacts, kv_type: str, n_ctx: int, launcher: Launcher, draft: str | None = None
) -> tuple[int, ...]:
    """:func:`kv_layer_bytes` of every block at ``n_ctx``: what does not depend on the context is worked out
    once per model (:func:`_layers_kv`), so each context the plan tries is one product per layer."""
    return tuple(layer.bytes_at(n_ctx) for layer in _layers_kv(facts, kv_type, launcher, draft))


@lru_cache(maxsize=64)
def _layers_kv(facts: GgufFacts, kv_type: str, launcher: Launcher, draft: str | None) -> tuple[_LayerKv, ...]:
    return tuple(_layer_kv(facts, layer, kv_type, launcher, draft) for layer in range(facts.num_layers))
