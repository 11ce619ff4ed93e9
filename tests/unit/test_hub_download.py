"""Downloading the chosen GGUF into the hub cache: what and how big is said first, a download whose
connection drops resumes with a Range request where it stopped (huggingface_hub's own retry, against
the local hub told to drop it once), a download stopped by Ctrl-C resumes in the next process (which
huggingface_hub 2.x alone does not: each process downloads into its own temporary file), and a file
already in the cache is not fetched again."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, BinaryIO

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
        # huggingface_hub waits a second before it resumes (its only use of time): not this test's subject
        monkeypatch.setattr("huggingface_hub.file_download.time", SimpleNamespace(sleep=lambda _s: None))
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


def _ctrl_c_after(limit: int, real_http_get: Any) -> Any:
    """``http_get`` whose file raises KeyboardInterrupt (Ctrl-C) before the write that would pass ``limit``."""

    def http_get(url: str, temp_file: BinaryIO, **kwargs: Any) -> None:
        class Interrupted:
            written = 0

            def write(self, data: bytes) -> int:
                if self.written + len(data) > limit:
                    raise KeyboardInterrupt
                self.written += len(data)
                return temp_file.write(data)

            def __getattr__(self, name: str) -> Any:
                return getattr(temp_file, name)

        real_http_get(url, Interrupted(), **kwargs)

    return http_get


def test_a_download_stopped_by_ctrl_c_resumes_in_the_next_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from huggingface_hub import constants, file_download

    source = tmp_path / "model.gguf"
    source.write_bytes(os.urandom(24 << 20))
    with running({"smollm2": source}) as (url, hub):
        monkeypatch.setattr(constants, "ENDPOINT", url)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
        real_http_get = file_download.http_get
        monkeypatch.setattr(file_download, "http_get", _ctrl_c_after(15 << 20, real_http_get))
        with pytest.raises(KeyboardInterrupt):
            download(REPO, (FILE,), source.stat().st_size)
        (partial,) = (tmp_path / "hub").rglob("*.gateway-partial")
        assert partial.stat().st_size == 10 << 20  # the first 10 MiB chunk reached the disk
        assert cached(REPO, FILE) is None  # nothing half-written in the cache's own layout
        monkeypatch.setattr(file_download, "http_get", real_http_get)  # the next run, uninterrupted
        hub.requests.clear()
        with caplog.at_level(logging.INFO, logger="gateway.hub"):
            path = download(REPO, (FILE,), source.stat().st_size)
        assert path.read_bytes() == source.read_bytes()
        ranges = [r for method, path_, r in hub.requests if method == "GET" and path_.endswith(FILE)]
        assert ranges == [f"bytes={10 << 20}-"]  # only the rest was fetched
        assert "resuming SmolLM2-135M-Instruct-Q4_1.gguf at 10.5 MB of 25.2 MB" in caplog.text
        assert not list((tmp_path / "hub").rglob("*.gateway-partial")) and cached(REPO, FILE) == path
