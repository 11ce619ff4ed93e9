"""Downloading the chosen files into the hub cache (``HF_HOME``), only those, with progress and resume.

huggingface_hub 2.x resumes a dropped connection within one process (``http_get`` retries with a
``Range`` request) but not across processes: each download goes to a process-unique temporary file
that is deleted when it fails (huggingface_hub PR 4228), so a 30 GB GGUF interrupted by Ctrl-C or a
killed container started over. Here each file's bytes go first to ``blobs/<etag>.gateway-partial``
beside the cache's own blobs (same content address, a name the library never uses), continued with
the library's ``http_get`` from where the last process stopped, under the gateway's cross-process lock
(:func:`gateway.core.files.exclusive`), and
renamed to ``blobs/<etag>`` when whole; ``hf_hub_download`` then finds the blob and only links it into
the snapshot, as it does for any blob already present. Before it starts, one line says what and how
big; afterwards, where it is. Offline (``HF_HUB_OFFLINE=1``) only the cache is looked at.

The hub's answers are not trusted (:mod:`gateway.hub.guard`): the blob's name (the ETag) must stay
inside the cache, the token is not sent where the file is served from another origin, and the file
never grows past the size the hub declared: an answer that tries is refused and its partial deleted.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, BinaryIO, cast

from gateway.core.errors import ModelError
from gateway.core.files import exclusive, inside
from gateway.hub.errors import hub_error
from gateway.hub.guard import DEFAULT_BYTES, UntrustedAnswer, budget, guard_hub, origin, trusted_origins

log = logging.getLogger("gateway.hub")


def cached(repo: str, filename: str) -> Path | None:
    """The file's path in the hub cache, or None (never touches the network)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, filename)
    return Path(found) if isinstance(found, str) else None


def _size(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"


class _Bounded:
    """The partial file as ``http_get`` writes it, refusing any byte past the size the hub declared
    (a server that sends more, or resumes past the end, never grows the file beyond it)."""

    def __init__(self, out: BinaryIO, size: int, url: str) -> None:
        self.out, self.size, self.url = out, size, url

    def write(self, data: bytes) -> int:
        if self.out.tell() + len(data) > self.size:
            raise UntrustedAnswer(f"{self.url}: more bytes than the {self.size:,} the hub declared: refused")
        return self.out.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.out, name)


def _fetch_blob(repo: str, name: str) -> int | None:
    """The file's bytes as its cache blob, continuing a partial download an earlier process left.
    Without an etag or a size from the hub nothing is done here (``hf_hub_download`` does it all). The
    size the hub declared, when it declared one.
    The blob's name is the hub's ETag, checked (by the guard, and here) to stay inside the cache; the
    token goes with the request only when the file is served from the hub's own origin."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get, repo_folder_name
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]  # a lazy export

    guard_hub()
    url = hf_hub_url(repo, name)
    meta = get_hf_file_metadata(url)
    if not meta.etag or meta.size is None or not meta.location:
        return meta.size
    cache = Path(constants.HF_HUB_CACHE)
    blobs = cache / repo_folder_name(repo_id=repo, repo_type="model") / "blobs"
    blob = inside(cache, blobs / meta.etag, f"the blob of {name}")
    if blob.exists():
        return meta.size
    blobs.mkdir(parents=True, exist_ok=True)
    partial = inside(cache, blobs / f"{meta.etag}.gateway-partial", f"the partial download of {name}")
    headers = build_hf_headers()
    if origin(meta.location) not in {origin(url), *trusted_origins()}:  # huggingface_hub's rule on redirects
        headers.pop("authorization", None)
    # two gateways fetching one file: the second waits, then finds it
    with exclusive(partial.with_name(f"{partial.name}.lock")):
        if blob.exists():
            return meta.size
        try:
            with partial.open("r+b" if partial.exists() else "wb") as out, budget(meta.size, name):
                have = out.seek(0, 2)
                if have > meta.size:  # not this file's bytes
                    out.truncate(have := 0)
                    out.seek(0)
                if have:
                    log.info("resuming %s at %s of %s", name, _size(have), _size(meta.size))
                http_get(
                    meta.location, cast(BinaryIO, _Bounded(out, meta.size, name)), resume_size=have, headers=headers,
                    expected_size=meta.size, displayed_filename=name,
                )  # fmt: skip
        except UntrustedAnswer:
            partial.unlink(missing_ok=True)  # a hostile answer's bytes are not resumed next time
            raise
        partial.replace(blob)
    return meta.size


def download(repo: str, files: tuple[str, ...], size: int) -> Path:
    """Every part of one GGUF into the hub cache; the first part's path (llama.cpp finds the others
    beside it: the cache keeps a revision's files in one snapshot directory)."""
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    guard_hub()
    missing = [name for name in files if cached(repo, name) is None]
    if missing:
        parts = f" in {len(files)} parts" if len(files) > 1 else ""
        about = f" ({_size(size)}{parts})" if size else ""
        log.info("downloading %s/%s%s into the hub cache", repo, files[0], about)
    paths = []
    for name in files:
        try:
            declared = _fetch_blob(repo, name) if name in missing else None
            with budget(declared or size or DEFAULT_BYTES, name):  # what hf_hub_download may still fetch
                paths.append(inside(Path(constants.HF_HUB_CACHE), Path(hf_hub_download(repo_id=repo, filename=name))))
        except (HfHubHTTPError, OfflineModeIsEnabled, OSError) as exc:
            raise hub_error(repo, exc, name) from exc
    if not paths:
        raise ModelError(f"{repo}: no file to download")
    if missing:
        log.info("downloaded %s to %s", files[0], paths[0].parent)
    return paths[0]
