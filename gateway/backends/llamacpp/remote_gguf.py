"""A GGUF's header read over HTTP range requests, without downloading the file.

The header (metadata, then the tensor table) sits at the start of the file: a few megabytes, most of
them the vocabulary. It is read through ``huggingface_hub``'s HTTP client (each read is a
``Range`` request on the resolve URL), starting with :data:`FIRST_READ` bytes and doubling until the
tensor table ends. A split GGUF has a header in every part, each with its own tensors: the parts'
tables are joined. The tensor sizes are then exact (``gguf file type`` and the tensor table), as if
the file were local.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gateway.backends.llamacpp.gguf_reader import GgufHeader, HeaderIncomplete, parse_gguf_header, read_gguf_header
from gateway.core.errors import ModelError
from gateway.hub.errors import hub_error
from gateway.hub.guard import guard_hub

FIRST_READ = 4 << 20  # a 150k-token vocabulary makes a header of about 3-4 MB
MAX_READ = 256 << 20  # a header larger than this is not a header


def _read_part(url: str, where: str, size: int) -> GgufHeader:
    """One file's header: a growing prefix until it parses."""
    length, data = FIRST_READ, b""
    while True:
        wanted = min(length, size)
        if wanted > len(data):
            data += _fetch(url, len(data), wanted)
        try:
            return parse_gguf_header(data, size, where)
        except HeaderIncomplete:
            if length >= min(size, MAX_READ):
                raise ModelError(f"{where}: no end of the GGUF header in its first {length:,} bytes") from None
            length *= 2


def _fetch(url: str, start: int, end: int) -> bytes:
    """Bytes ``start`` to ``end`` of the file at ``url``: one Range request, as ``HfFileSystem``'s files
    fetch a range, without the repository lookup and folder listing each of its files opens with (two
    more round trips to the hub per variant the plan weighs)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import (  # type: ignore[attr-defined]  # lazy exports
        build_hf_headers,
        hf_raise_for_status,
        http_backoff,
    )

    headers = {"range": f"bytes={start}-{end - 1}", **build_hf_headers()}
    answer = http_backoff("GET", url, headers=headers, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT)
    hf_raise_for_status(answer)
    return answer.content


_READ: dict[tuple[str, str, tuple[str, ...]], GgufHeader] = {}  # per process: plan and serve read once


def read_header(repo: str, files: tuple[str, ...], sizes: tuple[int, ...], endpoint: str | None = None) -> GgufHeader:
    """The header of a (possibly split) GGUF in ``repo``, its parts' tensor tables joined."""
    from huggingface_hub import constants, hf_hub_url

    key = (endpoint or constants.ENDPOINT, repo, files)
    if key in _READ:
        return _READ[key]
    guard_hub()  # each range read gets the bytes it asked for, no more (a server ignoring Range is cut off)
    headers = []
    try:
        for name, size in zip(files, sizes, strict=True):
            url = hf_hub_url(repo, name, endpoint=endpoint)
            headers.append(_read_part(url, f"{repo}/{name}", size))
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
