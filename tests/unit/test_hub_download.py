"""Downloading the chosen GGUF into the hub cache: what and how big is said first, a download whose
connection drops resumes with a Range request where it stopped (huggingface_hub's own retry, against
the local hub told to drop it once), and a file already in the cache is not fetched again. (Across
processes huggingface_hub 2.x starts over: each process downloads into its own temporary file.)"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from gateway.hub.fetch import cached, download
from tests.integration.tools.local_hub import running

REPO = "unsloth/SmolLM2-135M-Instruct-GGUF"
FILE = "SmolLM2-135M-Instruct-Q4_1.gguf"


def test_an_interrupted_download_resumes_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from huggingface_hub import constants

    source = tmp_path / "model.gguf"
    source.write_bytes(os.urandom(24 << 20))  # stands in for the GGUF: the bytes must arrive intact
    with running({"smollm2": source}) as (url, hub):
        monkeypatch.setattr(constants, "ENDPOINT", url)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
        hub.cut_once[f"/{REPO}/resolve/main/{FILE}"] = 15 << 20  # the connection drops after 15 MiB
        hub.requests.clear()
        with caplog.at_level(logging.INFO, logger="gateway.hub"):
            path = download(REPO, (FILE,), source.stat().st_size)
        assert path.read_bytes() == source.read_bytes()
        # resumed from what was written (the client writes in 10 MiB chunks), not restarted from 0
        ranges = [r for method, path, r in hub.requests if method == "GET" and path.endswith(FILE) and r]
        assert ranges == [f"bytes={10 << 20}-"]
        assert f"downloading {REPO}/{FILE} (25.2 MB) into the hub cache" in caplog.text
        assert cached(REPO, FILE) == path
        hub.requests.clear()
        assert download(REPO, (FILE,), source.stat().st_size) == path
        assert not [r for r in hub.requests if r[0] == "GET"]  # in the cache: nothing fetched again
