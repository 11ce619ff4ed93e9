"""Builds a tiny random-weight checkpoint vLLM can serve on a CPU (run with vLLM's Python).

    python make_tiny_model.py OUT_DIR [llama|qwen3_next]

``llama`` (the default): 2 layers. ``qwen3_next``: a hybrid of 3 gated delta-net layers and 1 attention
layer with 4 experts, so vLLM sizes a recurrent state per request beside the attention KV.

Random weights make random text: tests assert structure, never words. Head size 32 is the smallest
vLLM's CPU attention accepts. The tokenizer is a byte-level BPE trained on a few sentences, with a
chat template so /v1/chat/completions works.
"""

from __future__ import annotations

import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TEXT = [
    "The sea is calm tonight. The tide is full, the moon lies fair upon the straits.",
    "Write one short sentence about the sea. Say hello. What is the weather like?",
    "def add(a, b): return a + b  # a function that adds two numbers",
] * 50
# the tiny hybrid's own shape beside the shared body (make_session_checkpoint.py builds it on SmolLM2's tokenizer)
HYBRID = {
    "num_hidden_layers": 4,
    "head_dim": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 64,  # the CPU gated delta-net kernel takes 64 or 128
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
}


def main(out: Path, arch: str = "llama") -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
        Qwen3NextConfig,
        Qwen3NextForCausalLM,
    )

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(TEXT, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(0)
    # what both tiny models share: the tokenizer's ids, a 128-wide bf16 body with tied embeddings
    common = {
        "vocab_size": len(fast),
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "bos_token_id": fast.bos_token_id,
        "eos_token_id": fast.eos_token_id,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    }
    if arch == "qwen3_next":
        hybrid = Qwen3NextConfig(**common, **HYBRID)
        Qwen3NextForCausalLM(hybrid).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
        return
    config = LlamaConfig(**common, num_hidden_layers=2)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:3])
