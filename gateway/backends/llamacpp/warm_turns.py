"""What a later turn of an agent's session prefills again on llama-server, for a model whose cache
cannot roll back (recurrent layers: Qwen3-Next, Qwen3.5, Granite 4.0-H; sliding-window layers: Gemma,
gpt-oss): it resumes from a context checkpoint, or from nothing.

b11434 makes checkpoints during each prompt's prefill at its last user message and 4 + n_ubatch and 4
tokens before its end (tools/server/server-context.cpp:3819-3845, ref ggml-org/llama.cpp#20288), where
the model's cache cannot be rolled back (:3713-3720). On the next turn it restores the latest checkpoint
at or before the point where the new prompt leaves the slot's tokens (:3580-3606): the previous prompt's
last 4 tokens are prefilled again, besides what is new. Without a checkpoint (``--ctx-checkpoints 0``,
as when the plan finds no RAM for one) it clears the slot and prefills the whole conversation again
(:3595 ``do_reset``; measured on Gemma 3's sliding window: none of 1,529 tokens reused without,
1,491 with). Only the native server is worked out here (``gateway/backends/llamacpp/warm_sessions.py`` sizes
the checkpoints); llama-cpp-python's is not.
"""

from __future__ import annotations

from dataclasses import dataclass

CHECKPOINT_TAIL = 4  # the checkpoint nearest a prompt's end, that many tokens before it (server-context.cpp:3835)


@dataclass(frozen=True)
class WarmTurn:
    tokens: int  # of the previous prompt, prefilled again at most
    phrase: str

    def to_json(self) -> dict[str, object]:
        return {"tokens": self.tokens, "why": self.phrase}


def turn(needs_checkpoints: bool, checkpoints: int, n_ctx: int) -> WarmTurn | None:
    """On llama-server with ``checkpoints`` per slot (None: the model's cache rolls back, nothing to say)."""
    if not needs_checkpoints:
        return None
    if checkpoints:
        return WarmTurn(
            CHECKPOINT_TAIL,
            f"a later turn re-prefills at most {CHECKPOINT_TAIL} tokens of the last prompt (resumes from a "
            "context checkpoint: tools/server/server-context.cpp:3835)",
        )
    return WarmTurn(n_ctx, "a later turn re-prefills the whole conversation (no RAM for a context checkpoint)")
