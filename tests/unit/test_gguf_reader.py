"""The fast GGUF header reader agrees with the gguf package and fails clearly on bad files."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from gateway.backends.llamacpp.gguf_reader import read_gguf_header
from gateway.core.errors import ModelError


def _write_gguf(path: Path, tokens: list[str] | None = None, template: str = "{{ messages }}") -> None:
    tokens = tokens or [f"tok{i}" for i in range(300)]
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_context_length(4096)
    writer.add_block_count(2)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_token_list(tokens)  # a string array the reader must skip
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_chat_template(template)
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_reads_the_scalars_the_gguf_package_reads(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    _write_gguf(path)
    header = read_gguf_header(path)
    reference = gguf.GGUFReader(str(path))
    assert header.architecture == "llama"
    assert header.context_length == 4096
    assert header.tensor_count == len(reference.tensors) == 1
    for key in ("llama.block_count", "llama.embedding_length", "llama.attention.head_count_kv"):
        assert header.metadata[key] == reference.fields[key].contents()
    assert header.has_chat_template


def test_a_file_that_is_not_gguf_is_named(tmp_path: Path) -> None:
    path = tmp_path / "garbage.gguf"
    path.write_bytes(b"garbage" * 10)
    with pytest.raises(ModelError, match="garbage.gguf is not a GGUF file"):
        read_gguf_header(path)


def test_a_truncated_header_is_named(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    _write_gguf(path)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ModelError, match="truncated or corrupt GGUF header"):
        read_gguf_header(cut)


def test_an_empty_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"
    path.touch()
    with pytest.raises(ModelError, match="empty.gguf"):
        read_gguf_header(path)


def test_a_file_read_again_unchanged_is_not_parsed_again_and_a_changed_one_is(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    _write_gguf(path)
    first = read_gguf_header(path)
    assert read_gguf_header(path) is first  # the same file, unchanged: what was read before
    cut = path.read_bytes()[:200]
    path.write_bytes(cut)  # the same path rewritten (a re-download cut short): read afresh, and refused
    with pytest.raises(ModelError, match="truncated or corrupt GGUF header"):
        read_gguf_header(path)
    _write_gguf(path)
    assert read_gguf_header(path) == first


def test_a_vocabulary_like_one_stepped_over_before_is_stepped_over_by_its_own_bytes(tmp_path: Path) -> None:
    """The quantizations of a model share their vocabulary, and the reader steps over it once; a vocabulary
    with the same count and the same first bytes but another string further on is walked on its own."""
    tokens = [f"token-{i:05d}" for i in range(3000)]  # 48 kB: past the bytes the reader keys on
    other = [*tokens[:-1], "a longer last token"]
    for name, words, template in (("a", tokens, "A"), ("b", other, "B"), ("c", tokens, "C"), ("d", other, "D")):
        _write_gguf(tmp_path / f"{name}.gguf", words, template)
        header = read_gguf_header(tmp_path / f"{name}.gguf")  # what follows the vocabulary, read where it is
        assert header.metadata["tokenizer.chat_template"] == template and header.tensors[0].shape == (64, len(words))
