"""Model facts read from files without loading weights.

GGUF: the header's key/value metadata. The ``gguf`` package parses every array (a 262k-entry
vocabulary included) into numpy objects, which takes seconds; planning needs only scalars and short
per-layer arrays (``head_count_kv``, ``sliding_window_pattern``), so this reader walks the header with
``struct`` over an mmap and skips long arrays' contents.
"""

from __future__ import annotations

import hashlib
import itertools
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.core.errors import ModelError

_GGUF_MAGIC = b"GGUF"
# GGUF value types → struct format of one scalar
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_LENGTH = struct.Struct("<Q")  # a string's byte length, before its bytes
# String arrays stepped over (a vocabulary), by their count and first bytes: (their length, a digest of
# their bytes), oldest first. The same bytes are the same strings: a match is stepped over at once.
_ARRAYS: dict[tuple[int, bytes], tuple[int, bytes]] = {}
_ARRAYS_KEPT = 8
_HEAD_BYTES = 4096


def _digest(data: Any) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def _keep(store: dict[Any, Any], kept: int, key: Any, value: Any) -> None:
    """Remember ``value`` under ``key``, the oldest entry going first once ``kept`` are held."""
    if key not in store and len(store) >= kept:
        store.pop(next(iter(store)))
    store[key] = value


_SMALL_ARRAY = 4096  # arrays of numbers up to this length are kept: one value per layer (a vocabulary is not)
GGML_MAX_DIMS = 4  # ggml.h: a tensor has at most four dimensions (gguf.cpp refuses more)
MAX_ALIGNMENT = 1 << 20  # gguf.cpp needs a non-zero power of two; real files use 32


@dataclass(frozen=True)
class GgufTensor:
    name: str
    shape: tuple[int, ...]
    type_id: int
    offset: int  # from the start of the data section
    nbytes: int  # from the gap to the next tensor's offset (alignment padding included, <= 31 bytes)


@dataclass(frozen=True)
class GgufHeader:
    """Scalar metadata of a GGUF file (long arrays are recorded by length only) and its tensor table."""

    version: int
    tensor_count: int
    metadata: dict[str, Any]
    tensors: tuple[GgufTensor, ...] = ()

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_value(self, key: str) -> Any:
        """``<architecture>.<key>``, e.g. ``context_length`` or ``block_count``."""
        return self.metadata.get(f"{self.architecture}.{key}")

    @property
    def context_length(self) -> int | None:
        value = self.arch_value("context_length")
        return int(value) if value is not None else None

    @property
    def has_chat_template(self) -> bool:
        return "tokenizer.chat_template" in self.metadata


class _Cursor:
    def __init__(self, buffer: Any) -> None:  # an mmap or bytes
        self.buffer = buffer
        self.offset = 0

    def scalar(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.buffer, self.offset)[0]
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.scalar("<Q")
        raw = bytes(self.buffer[self.offset : self.offset + length])
        if len(raw) != length:
            raise struct.error("string runs past the end of the file")
        self.offset += length
        return raw.decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        """Step over ``count`` strings without decoding them: a vocabulary holds 150,000-250,000, and
        nothing the planner reads is among them. A vocabulary stepped over before (the plan reads each
        quantization of a model, and they share it) is recognised by its bytes and not walked again."""
        offset, buffer = self.offset, self.buffer
        head = bytes(buffer[offset : offset + _HEAD_BYTES])
        known = _ARRAYS.get((count, head))
        if known is not None and _digest(buffer[offset : offset + known[0]]) == known[1]:
            self.offset = offset + known[0]
            return
        length_at = _LENGTH.unpack_from
        for _ in range(count):
            offset += 8 + length_at(buffer, offset)[0]
        if offset > len(buffer):
            raise struct.error("string runs past the end of the file")
        _keep(_ARRAYS, _ARRAYS_KEPT, (count, head), (offset - self.offset, _digest(buffer[self.offset : offset])))
        self.offset = offset

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind, count = self.scalar("<I"), self.scalar("<Q")
            if count > len(self.buffer) - self.offset and item_kind not in _SCALARS:
                raise struct.error(f"an array of {count:,} items runs past the end of the file")
            if item_kind in _SCALARS and count <= _SMALL_ARRAY:  # per-layer values (head counts, SWA pattern)
                return _ArrayOf(item_kind, count, tuple(self.scalar(_SCALARS[item_kind]) for _ in range(count)))
            if item_kind in _SCALARS:
                self.offset += struct.calcsize(_SCALARS[item_kind]) * count
            elif item_kind == _STRING:
                self.skip_strings(count)
            else:
                for _ in range(count):
                    self.value(item_kind)
            return _ArrayOf(item_kind, count)
        raise struct.error(f"unknown GGUF value type {kind}")


@dataclass(frozen=True)
class _ArrayOf:
    """An array's length; its values only when short numbers (per-layer hyperparameters)."""

    item_kind: int
    count: int
    values: tuple[Any, ...] = ()


def read_gguf_header(path: Path) -> GgufHeader:
    """Read the metadata of ``path``; a file that is not GGUF raises ModelError naming it. A file read
    before in this process, unchanged since (same inode, size and modification time), is not parsed
    again: stepping over a 262,144-token vocabulary takes a quarter of a second, and planning and
    serving read the same file several times."""
    try:
        with path.open("rb") as handle:
            stat = os.fstat(handle.fileno())
            key = (str(path), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
            if (known := _READ.get(key)) is not None:
                return known
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
                header = parse_gguf_header(buffer, len(buffer), str(path))
        _keep(_READ, _READ_KEPT, key, header)
        return header
    except ValueError as exc:  # mmap refuses an empty file
        raise ModelError(f"{path}: truncated or corrupt GGUF header ({exc}): re-download it") from exc
    except OSError as exc:
        raise ModelError(f"cannot read {path}: {exc.strerror or exc}") from exc


_READ: dict[tuple[str, int, int, int, int], GgufHeader] = {}  # read_gguf_header's files, oldest first
_READ_KEPT = 16


class HeaderIncomplete(ModelError):
    """The bytes given end inside the header: read more of the file (a prefix fetched over HTTP)."""


def parse_gguf_header(buffer: Any, file_size: int, where: str) -> GgufHeader:
    """Parse a GGUF header from ``buffer`` (the whole file, or only its first bytes); ``file_size``
    is the whole file's length, which sizes the last tensor. A buffer that ends inside the header
    raises :class:`HeaderIncomplete` when the file is longer than the buffer."""
    if buffer[:4] != _GGUF_MAGIC:
        raise ModelError(f"{where} is not a GGUF file (magic {bytes(buffer[:4])!r}): re-download it")
    cursor = _Cursor(buffer)
    cursor.offset = 4
    try:
        version, tensor_count, kv_count = cursor.scalar("<I"), cursor.scalar("<Q"), cursor.scalar("<Q")
        for field, count, least in (("tensor_count", tensor_count, 24), ("kv_count", kv_count, 13)):
            if count * least > file_size:  # each takes at least this many bytes of the file
                raise ModelError(f"{where}: GGUF {field} = {count:,} does not fit in a {file_size:,}-byte file")
        metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key = cursor.string()
            metadata[key] = cursor.value(cursor.scalar("<I"))
        raw_tensors = []
        for _ in range(tensor_count):
            name = cursor.string()
            dims = cursor.scalar("<I")
            if dims > GGML_MAX_DIMS:
                raise ModelError(
                    f"{where}: GGUF tensor {name[:80]!r} has {dims:,} dimensions (at most {GGML_MAX_DIMS})"
                )
            shape = tuple(cursor.scalar("<Q") for _ in range(dims))
            raw_tensors.append((name, shape, cursor.scalar("<I"), cursor.scalar("<Q")))
    except (struct.error, ValueError) as exc:
        if len(buffer) < file_size:
            raise HeaderIncomplete(f"{where}: header continues past the first {len(buffer):,} bytes") from exc
        raise ModelError(f"{where}: truncated or corrupt GGUF header ({exc}): re-download it") from exc
    alignment = metadata.get("general.alignment", 32)
    if not (isinstance(alignment, int) and 0 < alignment <= MAX_ALIGNMENT and alignment & (alignment - 1) == 0):
        raise ModelError(
            f"{where}: GGUF general.alignment = {alignment!r} is not a power of two up to {MAX_ALIGNMENT:,}"
        )
    data_start = -(-cursor.offset // alignment) * alignment
    data_size = file_size - data_start
    ends = sorted({offset for *_, offset in raw_tensors} | {data_size})
    next_offset = dict(itertools.pairwise(ends))
    tensors = tuple(
        GgufTensor(name, shape, type_id, offset, max(0, next_offset.get(offset, data_size) - offset))
        for name, shape, type_id, offset in raw_tensors
    )
    return GgufHeader(version=version, tensor_count=tensor_count, metadata=metadata, tensors=tensors)
