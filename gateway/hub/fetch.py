"""Downloading the chosen files into the hub cache (``HF_HOME``), only those, with progress and resume.

huggingface_hub 2.x resumes a dropped connection within one process (``http_get`` retries with a
``Range`` request) but not across processes: each download goes to a process-unique temporary file
that is deleted when it fails (huggingface_hub PR 4228), so a 30 GB GGUF interrupted by Ctrl-C or a
killed container started over. Here each file's bytes go first to ``blobs/<etag>.gateway-partial``
beside the cache's own blobs (same content address, a name the library never uses), continued with
the library's ``http_get`` from where the last process stopped, under the library's file lock, and
renamed to ``blobs/<etag>`` when whole; ``hf_hub_download`` then finds the blob and only links it into
the snapshot, as it does for any blob already present. Before it starts, one line says what and how
big; afterwards, where it is. Offline (``HF_HUB_OFFLINE=1``) only the cache is looked at.
"""

from __future__ import annotations

import logging
from pathlib import Path

from gateway.core.errors import ModelError
from gateway.core.hub_errors import hub_error

log = logging.getLogger("gateway.hub")


def cached(repo: str, filename: str) -> Path | None:
    """The file's path in the hub cache, or None (never touches the network)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, filename)
    return Path(found) if isinstance(found, str) else None


def _size(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"


def _fetch_blob(repo: str, name: str) -> None:
    """The file's bytes as its cache blob, continuing a partial download an earlier process left.
    Without an etag or a size from the hub nothing is done here (``hf_hub_download`` does it all)."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get, repo_folder_name
    from huggingface_hub.utils import WeakFileLock, build_hf_headers  # type: ignore[attr-defined]  # lazy exports

    meta = get_hf_file_metadata(hf_hub_url(repo, name))
    if not meta.etag or meta.size is None or not meta.location:
        return
    blobs = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model") / "blobs"
    blob = blobs / meta.etag
    if blob.exists():
        return
    blobs.mkdir(parents=True, exist_ok=True)
    partial = blobs / f"{meta.etag}.gateway-partial"
    with WeakFileLock(f"{partial}.lock"):  # two gateways fetching one file: the second waits, then finds it
        if blob.exists():
            return
        with partial.open("r+b" if partial.exists() else "wb") as out:
            have = out.seek(0, 2)
            if have > meta.size:  # not this file's bytes
                out.truncate(have := 0)
                out.seek(0)
            if have:
                log.info("resuming %s at %s of %s", name, _size(have), _size(meta.size))
            http_get(
                meta.location, out, resume_size=have, headers=build_hf_headers(), expected_size=meta.size,
                displayed_filename=name,
            )  # fmt: skip
        partial.replace(blob)


def download(repo: str, files: tuple[str, ...], size: int) -> Path:
    """Every part of one GGUF into the hub cache; the first part's path (llama.cpp finds the others
    beside it: the cache keeps a revision's files in one snapshot directory)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    missing = [name for name in files if cached(repo, name) is None]
    if missing:
        parts = f" in {len(files)} parts" if len(files) > 1 else ""
        log.info("downloading %s/%s (%s%s) into the hub cache", repo, files[0], _size(size), parts)
    paths = []
    for name in files:
        try:
            if name in missing:
                _fetch_blob(repo, name)
            paths.append(Path(hf_hub_download(repo_id=repo, filename=name)))
        except (HfHubHTTPError, OfflineModeIsEnabled, OSError) as exc:
            raise hub_error(repo, exc, name) from exc
    if not paths:
        raise ModelError(f"{repo}: no file to download")
    if missing:
        log.info("downloaded %s to %s", files[0], paths[0].parent)
    return paths[0]
