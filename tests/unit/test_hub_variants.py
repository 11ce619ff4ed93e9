"""Finding a model's quantized variants with the real huggingface_hub client against the local hub
(tests/integration/tools/local_hub.py): trusted publishers first, every GGUF file with its size,
split files grouped, headers read over range requests, the quantization checked against the header,
and one-line errors naming HF_TOKEN or the repository."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.backends.llamacpp import hub_gguf
from gateway.backends.llamacpp.gguf_reader import GgufHeader
from gateway.backends.llamacpp.hub_gguf import GgufVariant, gguf_variants, group_gguf_files, quant_of
from gateway.backends.llamacpp.hub_variants import checked_quant, read_variant
from gateway.backends.llamacpp.remote_gguf import FIRST_READ, read_header
from gateway.backends.vllm import hub_checkpoints
from gateway.backends.vllm.hub_checkpoints import CheckpointVariant, checkpoint_variants, method_of
from gateway.core.errors import ModelError
from gateway.hub.search import named_after
from tests.integration.tools import gguf_shapes
from tests.integration.tools.local_hub import DATA, LocalHub

CODER = "Qwen/Qwen3-Coder-30B-A3B-Instruct"


@dataclass
class Found:
    """Both engines' answers for one model, as the planner gets them."""

    gguf: list[GgufVariant]
    checkpoints: list[CheckpointVariant]
    searched: list[str]
    offline: bool


def discover(model: str) -> Found:
    ggufs = gguf_variants(model)
    return Found(ggufs.variants, checkpoint_variants(model), ggufs.searched, ggufs.offline)


@pytest.mark.parametrize(
    ("name", "quant"),
    [
        ("Qwen3-Coder-30B-A3B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
        ("Qwen_Qwen3-8B-IQ4_XS.gguf", "IQ4_XS"),
        ("gpt-oss-20b-MXFP4.gguf", "MXFP4"),
        ("BF16/Model-BF16-00001-of-00002.gguf", "BF16"),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
        ("Q4_K_M-is-not-the-end-Q8_0.gguf", "Q8_0"),
        ("model.gguf", ""),
    ],
)
def test_the_quantization_is_read_from_the_file_name(name: str, quant: str) -> None:
    assert quant_of(name) == quant


def test_split_files_are_one_variant_and_an_incomplete_split_or_a_projector_is_none() -> None:
    listing = [
        ("BF16/M-BF16-00002-of-00002.gguf", 30),
        ("BF16/M-BF16-00001-of-00002.gguf", 31),
        ("Q8_0/M-Q8_0-00001-of-00002.gguf", 5),  # its second part is missing
        ("M-Q4_K_M.gguf", 18),
        ("mmproj-F16.gguf", 1),
        ("README.md", 2),
    ]
    assert sorted(group_gguf_files(listing)) == [
        (("BF16/M-BF16-00001-of-00002.gguf", "BF16/M-BF16-00002-of-00002.gguf"), 61),
        (("M-Q4_K_M.gguf",), 18),
    ]


@pytest.mark.parametrize(
    ("repo", "method"),
    [
        ("Qwen/Qwen3-8B-FP8", "fp8"),
        ("Qwen/Qwen3-8B-AWQ", "awq"),
        ("Qwen/Qwen3-32B-GPTQ-Int4", "gptq"),
        ("nvidia/Gemma-4-31B-IT-NVFP4", "nvfp4"),
        ("RedHatAI/Qwen3-8B-quantized.w4a16", "gptq"),
        ("Qwen/Qwen3-8B", None),
    ],
)
def test_a_checkpoints_method_comes_from_its_name(repo: str, method: str | None) -> None:
    assert method_of(repo) == method


def test_every_gguf_quantization_is_found_once_from_the_most_trusted_publisher(hub: LocalHub) -> None:
    found = discover(CODER)
    by_quant = {v.quant: v for v in found.gguf}
    # unsloth (trusted before bartowski and lmstudio-community) has every type; lmstudio-community's
    # Q8_0 and bartowski's Q4_K_M/Q6_K are the same types, so they are not taken
    assert set(by_quant) == {"Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "BF16"}
    assert {v.repo for v in found.gguf} == {"unsloth/Qwen3-Coder-30B-A3B-Instruct-GGUF"}
    sizes = [v.size for v in found.gguf]
    assert sizes == sorted(sizes, reverse=True)  # largest first
    listed = json.loads((DATA / "repos" / "unsloth__Qwen3-Coder-30B-A3B-Instruct-GGUF.json").read_text())
    assert by_quant["Q4_K_M"].files == ("Qwen3-Coder-30B-A3B-Instruct-Q4_K_M.gguf",)
    assert "Qwen3-Coder-30B-A3B-Instruct-Q4_K_M.gguf" in listed["files"]
    assert [c.repo for c in found.checkpoints] == ["Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8"]
    searches = [path for method, path, _ in hub.requests if path.startswith("/api/models?")]
    assert any("base_model%3Aquantized%3AQwen%2FQwen3-Coder" in s or "base_model:quantized" in s for s in searches)


def test_the_models_own_organisation_comes_before_other_publishers(hub: LocalHub) -> None:
    found = discover("Qwen/Qwen3-8B")
    by_quant = {v.quant: v.repo for v in found.gguf}
    # unsloth has more downloads, but the model's own organisation is trusted first
    assert by_quant["Q4_K_M"] == "Qwen/Qwen3-8B-GGUF" and by_quant["Q8_0"] == "Qwen/Qwen3-8B-GGUF"
    assert [c.quantization for c in found.checkpoints] == ["fp8", "awq"]  # more downloads first among equals


def test_published_sizes_match_the_shaped_headers_within_five_percent() -> None:
    """The shapes are real: a header built from the config gives the size the publisher lists."""
    checked = 0
    for path in (DATA / "repos").glob("*.json"):
        for spec in json.loads(path.read_text())["files"].values():
            if "published_size" in spec:
                shaped = spec["shaped"]
                built = gguf_shapes.build(DATA / shaped["config"], shaped["mix"], "x")
                assert abs(built.size - spec["published_size"]) / spec["published_size"] < 0.05
                checked += 1
    assert checked


def test_a_header_is_read_with_range_requests_growing_until_the_tensor_table_ends(
    hub: LocalHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = discover(CODER)
    q4 = next(v for v in found.gguf if v.quant == "Q4_K_M")
    monkeypatch.setattr("gateway.backends.llamacpp.remote_gguf.FIRST_READ", 1 << 20)  # smaller than this header
    monkeypatch.setattr("gateway.backends.llamacpp.remote_gguf._READ", {})  # not remembered from an earlier test
    hub.requests.clear()
    header = read_header(q4.repo, q4.files, (q4.size,))
    ranges = [r for method, path, r in hub.requests if path.endswith(q4.files[0]) and r]
    assert ranges[0] == f"bytes=0-{(1 << 20) - 1}" and len(ranges) >= 2  # the first MB was not enough
    assert all(int(r.split("-")[1]) < 16 << 20 for r in ranges)  # never the 18 GB file
    assert (
        header.metadata["general.file_type"] == 15 and len(header.tensors) == 579
    )  # as llama.cpp's converter writes Qwen3-MoE: 12 per block + 3
    assert FIRST_READ >= 1 << 20
    total = sum(t.nbytes for t in header.tensors)
    assert 0.95 * q4.size < total <= q4.size  # exact tensor sizes, not bits-per-weight


def test_a_name_the_header_contradicts_is_planned_as_the_header_says() -> None:
    variant = GgufVariant("o/r", ("M-Q4_K_M.gguf",), 10, "Q4_K_M", (0, 0))
    header = GgufHeader(version=3, tensor_count=0, metadata={"general.file_type": 17})
    quant, note = checked_quant(variant, header)
    assert quant == "Q5_K_M" and note is not None and "named Q4_K_M" in note
    assert checked_quant(variant, GgufHeader(3, 0, {"general.file_type": 15})) == ("Q4_K_M", None)


def test_an_unreadable_header_falls_back_to_a_labelled_estimate(hub: LocalHub) -> None:
    missing = GgufVariant("unsloth/Qwen3-Coder-30B-A3B-Instruct-GGUF", ("absent-Q4_K_M.gguf",), 1, "Q4_K_M", (0, 0))
    config = json.loads((DATA / "configs" / "Qwen3-Coder-30B-A3B-Instruct.json").read_text())
    read = read_variant(missing, "m", config, None)
    assert "ESTIMATED at 4.85 bits/weight" in read.notes[0] and read.facts.num_experts == 128


def test_a_gated_models_files_say_hf_token_and_a_missing_model_names_the_repository(hub: LocalHub) -> None:
    from gateway.hub.fetch import download

    llama = discover("meta-llama/Llama-3.1-8B-Instruct")  # its metadata is public, as on the hub
    assert {v.repo for v in llama.gguf} == {"bartowski/Meta-Llama-3.1-8B-Instruct-GGUF"}  # not gated
    with pytest.raises(ModelError, match="meta-llama/Llama-3.1-8B-Instruct is gated.*HF_TOKEN"):
        download("meta-llama/Llama-3.1-8B-Instruct", ("config.json",), 1)
    with pytest.raises(ModelError, match="no repository nobody/nothing on the hub"):
        discover("nobody/nothing")


def test_offline_the_last_search_is_remembered(hub: LocalHub, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    first = discover("Qwen/Qwen3-8B")
    monkeypatch.setattr("gateway.hub.search._SEARCHES", {})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.requests.clear()
    again = discover("Qwen/Qwen3-8B")
    assert again.offline and [v.files for v in again.gguf] == [v.files for v in first.gguf]
    assert hub.requests == []
    assert Path(constants.HF_HOME, "gateway-search", "Qwen--Qwen3-8B.json").is_file()


def test_the_search_is_written_beside_the_cache_only_when_it_learned_something(
    hub: LocalHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both engines ask for the same model in one plan: the record (written and fsynced) is rewritten
    only for what is new, a search or a publisher's results, not on every question."""
    from gateway.hub import search

    written: list[str] = []
    real = search.replace_atomically

    def counted(path: Path, text: str) -> None:
        written.append(path.name)
        real(path, text)

    monkeypatch.setattr(search, "replace_atomically", counted)
    search.search("Qwen/Qwen3-8B", ["bartowski"])
    assert written == ["Qwen--Qwen3-8B.json"]
    search.search("Qwen/Qwen3-8B", ["bartowski"])
    search.search("Qwen/Qwen3-8B")
    assert len(written) == 1
    search.search("Qwen/Qwen3-8B", ["unsloth"])  # a publisher not yet searched
    assert len(written) == 2


def test_a_split_gguf_is_one_variant_and_its_parts_tensor_tables_are_joined(
    hub: LocalHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gateway.backends.llamacpp.remote_gguf._READ", {})  # read here, not remembered

    found = discover(CODER)
    bf16 = next(v for v in found.gguf if v.quant == "BF16")
    assert bf16.files == (
        "BF16/Qwen3-Coder-30B-A3B-Instruct-BF16-00001-of-00002.gguf",
        "BF16/Qwen3-Coder-30B-A3B-Instruct-BF16-00002-of-00002.gguf",
    )
    read = read_variant(bf16, "m", None, None)
    assert read.facts.num_layers == 48 and read.quant == "BF16"
    assert sum(read.facts.layer_bytes) + read.facts.embedding_bytes > 0.95 * bf16.size  # both parts' tensors
    part_two = [r for _, path, r in hub.requests if path.endswith("00002-of-00002.gguf") and r.startswith("bytes=0-")]
    assert part_two, "the second part's header was read too"


def test_a_gguf_repository_named_directly_offers_its_own_files_first(hub: LocalHub) -> None:
    found = discover("bartowski/Qwen_Qwen3-Coder-30B-A3B-Instruct-GGUF")
    by_quant = {v.quant: v.repo for v in found.gguf}
    assert by_quant == {
        "Q4_K_M": "bartowski/Qwen_Qwen3-Coder-30B-A3B-Instruct-GGUF",
        "Q6_K": "bartowski/Qwen_Qwen3-Coder-30B-A3B-Instruct-GGUF",
    }


@pytest.mark.parametrize(
    ("repo", "name", "same"),
    [
        ("unsloth/Qwen3-8B-GGUF", "Qwen3-8B", True),
        ("bartowski/Qwen_Qwen3-Coder-30B-A3B-Instruct-GGUF", "Qwen3-Coder-30B-A3B-Instruct", True),
        ("bartowski/Meta-Llama-3.1-8B-Instruct-GGUF", "Llama-3.1-8B-Instruct", True),
        ("Qwen/Qwen3-8B-FP8", "Qwen3-8B", True),
        ("RedHatAI/Qwen3-8B-quantized.w4a16", "Qwen3-8B", True),
        ("Qwen/Qwen3-32B-GPTQ-Int4", "Qwen3-32B", True),
        ("unsloth/Qwen3-8B-Base-GGUF", "Qwen3-8B", False),
        ("unsloth/DeepSeek-R1-0528-Qwen3-8B-GGUF", "Qwen3-8B", False),
        ("unsloth/Qwen3-Coder-30B-A3B-Instruct-1M-GGUF", "Qwen3-Coder-30B-A3B-Instruct", False),
    ],
)
def test_a_searched_repository_counts_only_when_named_after_the_model(repo: str, name: str, same: bool) -> None:
    """Each engine allows its own quantization words after the name."""
    suffix = hub_gguf.NAME_SUFFIX if repo.endswith("GGUF") else hub_checkpoints.NAME_SUFFIX
    assert named_after(repo, name, suffix) is same


def test_near_miss_repositories_found_by_search_are_left_out(hub: LocalHub) -> None:
    found = discover("Qwen/Qwen3-8B")
    assert "Q3_K_M" not in {v.quant for v in found.gguf}  # only the near misses have one
    assert not {"unsloth/Qwen3-8B-Base-GGUF", "unsloth/DeepSeek-R1-0528-Qwen3-8B-GGUF"} & set(found.searched)
