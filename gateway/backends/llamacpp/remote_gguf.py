"""A GGUF's header read over HTTP range requests, without downloading the file.

The header (metadata, then the tensor table) sits at the start of the file: a few megabytes, most of
them the vocabulary. It is read through ``huggingface_hub``'s ``HfFileSystem`` (each read is a
``Range`` request on the resolve URL), starting with :data:`FIRST_READ` bytes and doubling until the
tensor table ends. A split GGUF has a header in every part, each with its own tensors: the parts'
tables are joined. The tensor sizes are then exact (``gguf file type`` and the tensor table), as if
the file were local.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from gateway.backends.llamacpp.gguf_reader import GgufHeader, HeaderIncomplete, parse_gguf_header, read_gguf_header
from gateway.core.errors import ModelError
from gateway.hub.errors import hub_error
from gateway.hub.guard import guard_hub

FIRST_READ = 4 << 20  # a 150k-token vocabulary makes a header of about 3-4 MB
MAX_READ = 256 << 20  # a header larger than this is not a header


def _read_part(fs: Any, path: str, size: int) -> GgufHeader:
    """One file's header: a growing prefix until it parses."""
    length = FIRST_READ
    with fs.open(path, "rb", cache_type="none") as handle:
        data = b""
        while True:
            wanted = min(length, size)
            if wanted > len(data):
                handle.seek(len(data))
                data += handle.read(wanted - len(data))
            try:
                return parse_gguf_header(data, size, path)
            except HeaderIncomplete:
                if length >= min(size, MAX_READ):
                    raise ModelError(f"{path}: no end of the GGUF header in its first {length:,} bytes") from None
                length *= 2


_READ: dict[tuple[str, str, tuple[str, ...]], GgufHeader] = {}  # per process: plan and serve read once


def read_header(repo: str, files: tuple[str, ...], sizes: tuple[int, ...], endpoint: str | None = None) -> GgufHeader:
    """The header of a (possibly split) GGUF in ``repo``, its parts' tensor tables joined."""
    from huggingface_hub import HfFileSystem, constants

    key = (endpoint or constants.ENDPOINT, repo, files)
    if key in _READ:
        return _READ[key]
    guard_hub()  # each range read gets the bytes it asked for, no more (a server ignoring Range is cut off)
    fs = HfFileSystem(endpoint=endpoint, skip_instance_cache=True)
    headers = []
    try:
        for name, size in zip(files, sizes, strict=True):
            headers.append(_read_part(fs, f"{repo}/{name}", size))
    except ModelError:
        raise
    except Exception as exc:  # HTTP errors, offline mode, the transport's own (connection refused, timeouts)
        raise hub_error(repo, exc, f"the GGUF header of {files[0]}") from exc
    _READ[key] = join_parts(headers)
    return _READ[key]


def join_parts(headers: list[GgufHeader]) -> GgufHeader:
    """A split GGUF as one: the first part's metadata, every part's tensors."""
    first = headers[0]
    if len(headers) == 1:
        return first
    tensors = tuple(t for header in headers for t in header.tensors)
    return replace(first, tensor_count=len(tensors), tensors=tensors)


def read_local(paths: list[Path]) -> GgufHeader:
    """The same for parts already on disk (the hub cache)."""
    return join_parts([read_gguf_header(path) for path in paths])
