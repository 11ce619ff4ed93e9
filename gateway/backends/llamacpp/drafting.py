"""llama-server's speculative decoding without a second model file (build 11434): drafting with the
model's own multi-token-prediction block (``--spec-type draft-mtp``) or from text already in the
context (``--spec-type ngram-mod``).

What the source says (common/speculative.cpp, common/common.cpp, src/llama-model.cpp):

- The MTP (nextn) blocks are the GGUF's last ``nextn_predict_layers`` blocks (convert_hf_to_gguf.py
  writes ``block_count = num_hidden_layers + nextn``). Without draft-mtp their tensors are skipped at
  load (``TENSOR_SKIP`` unless ``load_mtp``) and the main context's KV cache filters them out
  (``il < n_layer()``); ``-ngl`` still counts them as slots (``n_layer_all + 1``).
- With draft-mtp the tensors load and a second context (``LLAMA_CONTEXT_TYPE_MTP``) holds a KV cache
  of the nextn layers alone, with the target's ``n_ctx``, KV types and ubatch, and its own compute
  buffer. It drafts ``--spec-draft-n-max`` tokens (default 3) per step.
- ngram-mod keeps one hash table of 4 Mi 32-bit entries (16 MiB of host RAM) and drafts up to 64
  tokens that repeat what the context already holds (llama-server's ``--spec-default`` uses it), none
  when fewer than 48 are found (``common_params_speculative_ngram_mod``: n_max 64, n_min 48).
- A step must hold every generating slot's sampled token and its whole draft: llama-server allocates
  its step batch for max(``-b``, ``-np``) tokens and aborts when they do not fit
  (tools/server/server-context.cpp:576, ``GGML_ASSERT(... "batch must be large enough to hold the
  sampled and draft tokens")``; the draft is bounded only by the context and the tokens left to
  generate, server-context.cpp:517-535). With ``-b 64`` one 64-token n-gram draft is 65 tokens: the
  server died at the first file it was asked to repeat. So where ``slots x (1 + the mode's draft)``
  exceeds the step, the draft is capped at ``step // slots - 1`` (``step_bound``).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.backends.llamacpp.gguf_facts import GgufFacts
from gateway.backends.llamacpp.launcher import Launcher

MODES = ("auto", "mtp", "ngram", "off")
# GGUF architectures whose src/models/<arch>.cpp builds an MTP draft graph (LLM_GRAPH_TYPE_DECODER_MTP)
# in b11434; Gemma 4 drafts with a separate assistant model and is not among them
MTP_ARCHITECTURES = frozenset(
    {
        "glm4moe", "deepseek2", "deepseek32", "deepseek4", "glm-dsa", "glm5-next", "qwen3next", "qwen35",
        "qwen35moe", "qwen4exp", "step35", "bailingmoe3", "cohere2moe", "hy_v3", "mimo2", "nemotron_h_moe",
    }
)  # fmt: skip
# the same architectures under their config.json model_type (convert_hf_to_gguf.py's mapping), for a
# plan made from the config before the GGUF is read
MTP_MODEL_TYPES = frozenset(
    {"glm4_moe", "glm4_moe_lite", "deepseek_v3", "deepseek_v32", "qwen3_next", "qwen3_5", "qwen3_5_moe"}
)
MTP_DRAFT_TOKENS = 3  # --spec-draft-n-max's default (common.h), the recurrent rows n_rs_seq reserves
NGRAM_TABLE_BYTES = 4 * 1024 * 1024 * 4  # common_ngram_mod(n_match, 4*1024*1024) entries of int32
NGRAM_DRAFT_TOKENS = 64  # ngram-mod's n_max (common.h)
NGRAM_MIN_SHARE = (48, 64)  # its n_min of n_max: no draft shorter than 3/4 of the most
ARGV = {"mtp": ["--spec-type", "draft-mtp"], "ngram": ["--spec-type", "ngram-mod"]}
DRAFT_TOKENS = {"mtp": MTP_DRAFT_TOKENS, "ngram": NGRAM_DRAFT_TOKENS}
# the flags that bound a mode's draft (common/arg.cpp of build 11434)
BOUND_FLAGS = {"mtp": ("--spec-draft-n-max",), "ngram": ("--spec-ngram-mod-n-max", "--spec-ngram-mod-n-min")}
LABEL = {"mtp": "MTP drafting (draft-mtp)", "ngram": "n-gram drafting (ngram-mod)"}


def mtp_blocks(facts: GgufFacts) -> range:
    """The slots of the GGUF's nextn blocks: its last ``mtp_layers`` blocks."""
    return range(facts.num_layers - facts.mtp_layers, facts.num_layers) if facts.mtp_layers else range(0)


def mtp_block_bytes(facts: GgufFacts) -> int:
    """What the nextn blocks weigh in this file (0 when a conversion with --no-mtp left them out)."""
    if not facts.layer_bytes:
        return 0
    return sum(facts.layer_bytes[slot] for slot in mtp_blocks(facts))


def loaded(facts: GgufFacts, slot: int, draft: str | None) -> bool:
    """Whether llama.cpp loads block ``slot`` and gives it a cache: every trunk block; a nextn block
    only when drafting with it."""
    return draft == "mtp" or slot not in mtp_blocks(facts)


@dataclass(frozen=True)
class DraftPlan:
    """The draft modes to evaluate: ``base`` for every rung of the ladder, and ``optional`` (MTP) as
    a twin of each rung, taken only where it costs nothing else; ``note``: what the plan says."""

    base: str | None = None
    optional: str | None = None
    note: str | None = None


def modes(facts: GgufFacts, setting: str, launcher: Launcher) -> DraftPlan:
    """What to evaluate for this model, setting and server.

    ``auto`` (native llama-server): n-gram drafting on every rung (measured: no cost on free text, 2.7x
    on a file repeated back, benchmarks/draft_speed.py), and MTP drafting instead where the file
    carries the block, the architecture drafts with it and it costs no context, KV type or layer;
    ``mtp`` / ``ngram``: that mode alone; ``off``: none. llama-cpp-python is never drafted for."""
    has_block = mtp_block_bytes(facts) > 0
    read = facts.weight_bytes_source == "gguf tensor table"
    supported = facts.model_type in MTP_ARCHITECTURES | MTP_MODEL_TYPES
    if setting == "off":
        return DraftPlan()
    if not launcher.drafts:
        if setting in ("mtp", "ngram"):
            return DraftPlan(note=f"llama.cpp: --llama-draft {setting} needs the native llama-server; not drafting")
        return DraftPlan()
    if setting == "ngram":
        return DraftPlan(base="ngram")
    if setting == "mtp" and not (has_block and supported):
        why = (
            f"its architecture ({facts.model_type}) has no MTP graph in llama.cpp b11434"
            if not supported
            else "the GGUF has no MTP (nextn) block"
            if read
            else "the model has no MTP (nextn) layers"
        )
        return DraftPlan(note=f"llama.cpp: --llama-draft mtp: {why}; not drafting")
    if setting == "mtp":
        return DraftPlan(base="mtp")
    note = None
    if has_block and supported and not read:
        note = "llama.cpp: MTP drafting planned if the GGUF keeps the nextn block (some omit it)"
    # a recurrent layer's state cannot be rolled back to a rejected draft without the per-draft rows
    # only MTP reserves (n_rs_seq): no n-gram drafting by default for hybrid models
    base = None if facts.recurrent_layers else "ngram"
    return DraftPlan(base=base, optional="mtp" if has_block and supported else None, note=note)


@dataclass(frozen=True)
class StepBound:
    """A draft capped so that every slot's sampled token and draft fit one step: ``argv`` (empty when the
    mode's own bound fits) and ``tokens``, the longest draft then."""

    argv: tuple[str, ...]
    tokens: int


def step_bound(mode: str, step: int, slots: int, given: list[str] | tuple[str, ...] = ()) -> StepBound:
    """The draft bound for ``mode`` when ``slots`` slots generate in a ``step``-token batch: ``slots x
    (1 + draft)`` tokens must fit it (llama-server aborts otherwise). None added when the mode's own
    bound fits, or when the user's own llama-server command (``given``) bounds the draft itself."""
    fits = max(step // max(slots, 1) - 1, 0)
    own = DRAFT_TOKENS[mode]
    if fits >= own or any(word.split("=")[0] in BOUND_FLAGS[mode] for word in given):
        return StepBound((), own)
    if mode == "ngram":
        least = fits * NGRAM_MIN_SHARE[0] // NGRAM_MIN_SHARE[1]
        return StepBound(("--spec-ngram-mod-n-max", str(fits), "--spec-ngram-mod-n-min", str(least)), fits)
    return StepBound(("--spec-draft-n-max", str(fits)), fits)
