"""A GGUF's precision is what its tensor table holds (issue 42): its bytes over its weights, and full precision
in the format the model itself was released in; its file name's type is only the fallback for a header that
was not read."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from gateway.backends.llamacpp.gguf_facts import GgufFacts, facts_from_gguf
from gateway.backends.llamacpp.gguf_reader import parse_gguf_header
from gateway.backends.llamacpp.ladder import precision_bits
from tests.integration.tools import gguf_shapes

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "hub" / "configs"


def read(config: str, mix: str) -> GgufFacts:
    """The facts the plan reads from a GGUF of ``config`` in ``mix`` (its header, as the hub serves it)."""
    header, size = gguf_shapes.header_bytes(json.loads((CONFIGS / config).read_text()), mix, "x")
    return facts_from_gguf(parse_gguf_header(header, size, "x"), "x")


def test_bits_per_weight_are_the_tensor_tables_bytes_over_its_weights() -> None:
    facts = read("Qwen3-8B.json", "Q4_K_M")
    assert facts.weight_count == 8_190_735_360  # every tensor's elements: Qwen3-8B's 8.19B parameters
    assert facts.main_weight_type == "Q4_K"
    # Q4_K (4.5 bits) for most matrices, Q6_K (6.5625) for attn_v / ffn_down and the output, f32 norms
    assert 4.5 < facts.bits_per_weight < 5.2
    assert precision_bits(facts, "Qwen3-8B-Q4_K_M.gguf") == facts.bits_per_weight


def test_a_file_is_ranked_by_what_it_holds_not_by_its_name() -> None:
    """A "Q4_K_M" whose matrices cannot be K-quantized (gpt-oss's rows of 2,880) holds Q8_0: 8.45 bits, not 4.85."""
    facts = read("gpt-oss-20b.json", "Q4_K_M")
    assert facts.main_weight_type == "Q8_0"
    assert precision_bits(facts, "gpt-oss-20b-Q4_K_M.gguf") == 8.45
    # the same file renamed: the table decides, not the name
    assert precision_bits(facts, "gpt-oss-20b-MXFP4.gguf") == 8.45


def test_the_models_own_format_is_full_precision_whatever_the_file_is_called() -> None:
    """gpt-oss was released with MXFP4 experts (its config.json's quantization_config): its MXFP4 GGUF is the
    checkpoint as released, ranked as full precision (16) even under another name."""
    facts = read("gpt-oss-20b.json", "MXFP4")
    assert facts.main_weight_type == "MXFP4"
    assert facts.bits_per_weight < 5
    assert precision_bits(facts, "gpt-oss-20b-MXFP4.gguf") == 16.0
    assert precision_bits(facts, "renamed.gguf") == 16.0
    # MXFP4 is not another model's own format: a Qwen3 MXFP4 file is ranked by its bits
    qwen = read("Qwen3-8B.json", "MXFP4")
    assert precision_bits(qwen, "Qwen3-8B-MXFP4.gguf") == qwen.bits_per_weight < 5


def test_without_a_tensor_table_the_name_decides() -> None:
    """Sizes estimated (the header could not be read): no weights counted, the type's name gives the bits."""
    facts = read("Qwen3-8B.json", "Q4_K_M")
    estimated = replace(facts, weight_count=0, main_weight_type="")
    assert estimated.bits_per_weight == 0.0
    assert precision_bits(estimated, "Qwen3-8B-Q4_K_M.gguf") == 4.85
