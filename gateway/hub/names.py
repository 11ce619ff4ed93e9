"""Names that come from a user or a hub and end up in paths and URLs: a repository id as huggingface_hub
accepts one (``validate_repo_id``: at most 96 characters of letters, digits, ``-``, ``_``, ``.`` on
each side of one ``/``, no ``--`` or ``..``, no leading or trailing ``-``/``.``) and a repository's
file name (a relative path whose parts are plain names). Anything else is refused with one line."""

from __future__ import annotations

import re

from gateway.core.errors import ModelError, shown

# huggingface_hub.utils._validators.REPO_ID_REGEX, with the namespace required (models are org/name)
_REPO_PART = r"[\w\-.]{1,96}"
REPO_ID = re.compile(rf"\b{_REPO_PART}\b/\b{_REPO_PART}\b", re.ASCII)
MAX_FILE_NAME = 1024
_FILE_PART = re.compile(r"[^\x00-\x1f\x7f/\\]+")


def repo_id_problem(repo: str) -> str | None:
    """Why ``repo`` is not a hub model id, or None when it is one."""
    if len(repo) > 2 * 96 + 1:
        return "longer than a hub id can be (at most 96 characters on each side of '/')"
    if not REPO_ID.fullmatch(repo):
        return "a hub id is org/name: letters, digits, '-', '_' and '.' on each side of one '/'"
    if "--" in repo or ".." in repo or repo.endswith(".git"):
        return "a hub id has no '--', '..' or '.git'"
    return None


def check_repo_id(repo: str) -> str:
    """``repo`` when it is a valid hub model id; otherwise ModelError naming the rule."""
    if (problem := repo_id_problem(repo)) is not None:
        raise ModelError(f"{shown(repo)} is not a hub repository id: {problem}")
    return repo


def file_name_ok(name: str) -> bool:
    """Whether a listing's file name is a relative path of plain names (no ``..``, no absolute path,
    no control characters): one the cache can hold inside its snapshot."""
    if not name or len(name) > MAX_FILE_NAME or name.startswith("/"):
        return False
    parts = name.split("/")
    return all(_FILE_PART.fullmatch(part) and part not in (".", "..") for part in parts)
