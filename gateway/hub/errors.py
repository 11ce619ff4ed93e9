"""The hub's failures as one line that names the fix: HF_TOKEN for a gated repository, the repository
for a missing one, the network or HF_HUB_OFFLINE otherwise."""

from __future__ import annotations

from gateway.core.errors import ModelError


def hub_error(repo: str, exc: Exception, what: str = "") -> ModelError:
    """``exc`` from huggingface_hub as a ModelError whose message says what to do."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
    )

    where = f"{what} of {repo}" if what else repo
    refused = _refusal(exc)
    if refused is not None:  # the guard's own line already names what was refused
        return refused
    if isinstance(exc, GatedRepoError):
        return ModelError(
            f"{repo} is gated: accept its licence on the hub, then export HF_TOKEN=<a token with access> and retry"
        )
    if isinstance(exc, RepositoryNotFoundError):
        return ModelError(f"no repository {repo} on the hub (or it is private: export HF_TOKEN): check the model id")
    if isinstance(exc, EntryNotFoundError):
        return ModelError(f"{where}: not in the repository: check the file name")
    if isinstance(exc, OfflineModeIsEnabled | LocalEntryNotFoundError):
        return ModelError(
            f"{where} is not in the hub cache and HF_HUB_OFFLINE is set (or the hub cannot be reached): "
            "unset HF_HUB_OFFLINE with network access once, or pass a local file or directory"
        )
    return ModelError(f"cannot read {where} from the hub ({type(exc).__name__}: {exc}): check the network or HF_TOKEN")


def _refusal(exc: BaseException | None) -> ModelError | None:
    """The guard's refusal (guard.UntrustedAnswer) behind ``exc``, however the library wrapped it."""
    from gateway.hub.guard import UntrustedAnswer

    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, UntrustedAnswer):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None
