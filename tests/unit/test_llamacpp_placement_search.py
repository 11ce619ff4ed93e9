"""The placement search skips the layer counts (and counts of experts in RAM) whose weights and KV
alone exceed all the GPUs' usable memory together; these tests hold it to the old exhaustive descent:
the same placement and the same reason on real models' shapes across machines from far too small to
roomy, and the bound it skips by equal to what :func:`place` puts on the GPUs."""

from __future__ import annotations

import json
import random
from functools import cache
from pathlib import Path

import pytest

from gateway.backends.llamacpp import placement_search
from gateway.backends.llamacpp.gguf_facts import GgufFacts, facts_from_gguf
from gateway.backends.llamacpp.gguf_reader import parse_gguf_header
from gateway.backends.llamacpp.launcher import NATIVE, PYTHON, Launcher
from gateway.backends.llamacpp.placement import place
from gateway.backends.llamacpp.placement_query import PlacementQuery
from gateway.backends.llamacpp.placement_search import best_placement
from gateway.core.devices import Device
from tests.integration.tools import gguf_shapes

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "hub" / "configs"
# dense, sliding windows, per-layer heads, MoE, MoE with a nextn (MTP) block, hybrid recurrent
MODELS = (
    "SmolLM2-135M-Instruct",
    "Llama-3.1-8B-Instruct",
    "gemma-3-27b-it",
    "gemma-4-31B-it",
    "Qwen3-Coder-30B-A3B-Instruct",
    "GLM-4.5-Air",
    "granite-4.0-h-small",
    "gpt-oss-20b",
)


@cache
def _facts(model: str) -> GgufFacts:
    config = json.loads((CONFIGS / f"{model}.json").read_text())
    header, size = gguf_shapes.header_bytes(config, "Q4_K_M", model)
    return facts_from_gguf(parse_gguf_header(header, size, f"{model}-Q4_K_M.gguf"), model)


def _gpus(facts: GgufFacts, share: float, layout: str) -> tuple[Device, ...]:
    """GPUs holding ``share`` of the model's weights together: one, two alike, two unlike, or a local
    GPU with a remote one (no op offload there)."""
    weights = sum(facts.layer_bytes or ()) + facts.output_bytes
    total = int(share * weights) + 1024**3  # + the margin the search keeps free on each card
    parts = {"1": (1.0,), "2": (0.5, 0.5), "2-unlike": (0.3, 0.7), "local+remote": (0.6, 0.4)}[layout]
    return tuple(
        Device(
            i,
            "simulated",
            int(total * p),
            int(total * p),
            (8, 9),
            node="node2" if layout == "local+remote" and i else "",
        )
        for i, p in enumerate(parts)
    )


def _cases(count: int) -> list[tuple[str, float, str, int, str, Launcher, str | None]]:
    """A fixed sample of (model, share of the weights the GPUs hold, layout, context, KV type, launcher, draft)."""
    rng = random.Random(33)
    grid = [
        (model, share, layout, n_ctx, kv, launcher, draft)
        for model in MODELS
        for share in (0.05, 0.2, 0.45, 0.7, 0.9, 1.0, 1.1, 1.4)
        for layout in ("1", "2", "2-unlike", "local+remote")
        for n_ctx in (8192, 131072)
        for kv in ("f16", "q8_0")
        for launcher in (NATIVE, PYTHON)
        for draft in ((None, "mtp", "ngram") if launcher.drafts else (None,))
    ]
    return rng.sample(grid, count)


@pytest.mark.parametrize(
    "case", _cases(64), ids=lambda case: "-".join(str(getattr(part, "name", part)) for part in case)
)
def test_the_pruned_search_places_exactly_as_the_exhaustive_descent(
    case: tuple[str, float, str, int, str, Launcher, str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, share, layout, n_ctx, kv, launcher, draft = case
    facts = _facts(model)
    gpus = _gpus(facts, share, layout)
    pruned = best_placement(PlacementQuery(facts, gpus, n_ctx, kv, launcher, draft))
    # without the bound (every count passes it) the search is the old descent over every count
    monkeypatch.setattr(placement_search, "gpu_bytes_by_layers", lambda *_: [0] * (facts.num_layers + 2))
    monkeypatch.setattr(placement_search, "gpu_bytes_by_experts_in_ram", lambda *_: [0] * (facts.num_layers + 1))
    exhaustive = best_placement(PlacementQuery(facts, gpus, n_ctx, kv, launcher, draft))
    assert pruned == exhaustive


@pytest.mark.parametrize("model", MODELS)
def test_the_bound_is_what_place_puts_on_the_gpus_for_every_count(model: str) -> None:
    """Equal, not just below: the weights and KV on the devices add up to the bound whatever the split,
    so a count whose bound is past the GPUs' room together overflows at least one of them."""
    facts = _facts(model)
    gpus = _gpus(facts, 0.5, "2-unlike")
    for draft in (None, "mtp"):
        by_layers = placement_search.gpu_bytes_by_layers(PlacementQuery(facts, gpus, 32768, "f16", NATIVE, draft))
        for layers in range(facts.num_layers + 2):
            placed = place(PlacementQuery(facts, gpus, 32768, "f16", NATIVE, draft=draft), layers)
            assert sum(placed.device_model) + sum(placed.device_kv) == by_layers[layers], (layers, draft)
        if facts.is_moe and facts.expert_layer_bytes:
            by_moe = placement_search.gpu_bytes_by_experts_in_ram(
                PlacementQuery(facts, gpus, 32768, "f16", NATIVE, draft)
            )
            for moe in range(facts.num_layers + 1):
                placed = place(
                    PlacementQuery(facts, gpus, 32768, "f16", NATIVE, draft=draft), facts.num_layers + 1, moe
                )
                assert sum(placed.device_model) + sum(placed.device_kv) == by_moe[moe], (moe, draft)
