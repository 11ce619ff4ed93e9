"""Downloading the chosen files into the hub cache (``HF_HOME``), only those, with progress and resume.

``hf_hub_download`` does the work: it keeps an ``.incomplete`` file and resumes it with a ``Range``
request, shows a progress bar on a terminal, and a second call finds the file in the cache without
downloading. Before it starts, one line says what and how big; afterwards, where it is. Offline
(``HF_HUB_OFFLINE=1``) only the cache is looked at.
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
            paths.append(Path(hf_hub_download(repo_id=repo, filename=name)))
        except (HfHubHTTPError, OfflineModeIsEnabled, OSError) as exc:
            raise hub_error(repo, exc, name) from exc
    if not paths:
        raise ModelError(f"{repo}: no file to download")
    if missing:
        log.info("downloaded %s to %s", files[0], paths[0].parent)
    return paths[0]
