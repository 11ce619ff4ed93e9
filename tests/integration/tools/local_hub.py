"""A local Hugging Face hub for tests: the routes the real ``huggingface_hub`` client calls, answered
from tests/data/hub/ (a NAMED stand-in for huggingface.co, which tests must never reach).

Routes, as ``huggingface_hub`` 1.x builds them (hf_api.py, file_download.py, hf_file_system.py):

- ``GET /api/models/{repo}`` (and ``/revision/{rev}``): ``model_info``; ``blobs=True``
  (``files_metadata``) adds each sibling's size and LFS block; ``expand`` is accepted.
- ``GET /api/models``: ``list_models`` with ``filter`` (tags such as
  ``base_model:quantized:Qwen/Qwen3-8B``, repeatable), ``author``, ``search``, ``sort``, ``limit``.
- ``POST /api/models/{repo}/paths-info/{rev}``: ``get_paths_info`` (HfFileSystem's ``info``).
- ``HEAD``/``GET /{repo}/resolve/{rev}/{path}``: ``hf_hub_download`` / ``get_hf_file_metadata``
  (``ETag``, ``X-Repo-Commit``, ``Content-Length``) and ``Range`` requests (HfFileSystem reads,
  resumed downloads) answered 206 with ``Content-Range``.
- A gated repository's metadata is public (``"gated": "manual"``), as on the hub; its files answer
  401 with ``X-Error-Code: GatedRepo`` unless a token is sent. A missing repository answers 404 with
  ``X-Error-Code: RepoNotFound`` — the codes ``hf_raise_for_status`` maps to its errors.

Each repository is one JSON file in tests/data/hub/repos/ (its id, tags, downloads, where its figures
come from, its files). A file is ``{"text": ...}``, ``{"path": "configs/x.json"}`` (relative to
tests/data/hub/), ``{"shaped": {"config", "mix", "template"}}`` (a GGUF header built to the real
shapes by :mod:`tests.integration.tools.gguf_shapes`, zeros after it), ``{"real": NAME}`` (a real
local file the caller maps NAME to: the small GGUFs that engines really load), or ``{"raw": bytes}``
(in a repository a test adds in code: a hostile header, say).

``hostile`` maps a request path to an answer of the test's own (a malicious hub:
:mod:`tests.integration.tools.hostile_hub`), given before any route is looked at.

Run as a script: ``python -m tests.integration.tools.local_hub --port 8765`` then
``HF_ENDPOINT=http://127.0.0.1:8765 gateway plan --model Qwen/Qwen3-Coder-30B-A3B-Instruct ...``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import threading
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.integration.tools.gguf_shapes import ShapedGguf, build
from tests.served_thread import WakeableServer
from tests.waiting import wait_until

DATA = Path(__file__).resolve().parents[2] / "data" / "hub"
CHUNK = 1 << 20


@dataclass
class HubFile:
    """One file of a repository: its bytes come from text, a data file, a shaped header or a real file."""

    name: str
    spec: dict[str, Any]
    real: dict[str, Path]

    @cached_property
    def _shaped(self) -> ShapedGguf | None:
        shaped = self.spec.get("shaped")
        if not shaped:
            return None
        template = DATA / shaped["template"] if shaped.get("template") else None
        split = tuple(shaped.get("split", (1, 1)))
        return build(DATA / shaped["config"], shaped["mix"], self.name, template, (int(split[0]), int(split[1])))

    @cached_property
    def _local(self) -> Path | None:
        if "path" in self.spec:
            return DATA / self.spec["path"]
        if "real" in self.spec:
            return self.real.get(self.spec["real"])
        return None

    @property
    def available(self) -> bool:
        return "real" not in self.spec or self._local is not None

    @cached_property
    def size(self) -> int:
        if "raw" in self.spec:
            return len(self.spec["raw"])
        if self._shaped is not None:
            return self._shaped.size
        if self._local is not None:
            return self._local.stat().st_size
        return len(str(self.spec.get("text", "")).encode())

    def read(self, start: int, end: int) -> bytes:
        if "raw" in self.spec:
            return bytes(self.spec["raw"][start:end])
        if self._shaped is not None:
            return self._shaped.read(start, end)
        if self._local is not None:
            with self._local.open("rb") as handle:
                handle.seek(start)
                return handle.read(end - start)
        return str(self.spec.get("text", "")).encode()[start:end]

    @cached_property
    def etag(self) -> str:
        spec = json.dumps(self.spec, sort_keys=True, default=lambda raw: hashlib.sha256(raw).hexdigest())
        return hashlib.sha256(f"{self.name}:{self.size}:{spec}".encode()).hexdigest()

    @property
    def is_lfs(self) -> bool:
        return self.size > 10 * 1024 or self.name.endswith((".gguf", ".safetensors"))


@dataclass
class HubRepo:
    data: dict[str, Any]
    real: dict[str, Path]
    files: dict[str, HubFile] = field(init=False)

    def __post_init__(self) -> None:
        self.files = {name: HubFile(name, spec, self.real) for name, spec in self.data.get("files", {}).items()}
        self.files = {name: f for name, f in self.files.items() if f.available}

    @property
    def id(self) -> str:
        return str(self.data["id"])

    @property
    def sha(self) -> str:
        return hashlib.sha1(self.id.encode()).hexdigest()

    def summary(self) -> dict[str, Any]:
        """What list_models returns for one repository."""
        return {
            "_id": self.sha[:24],
            "id": self.id,
            "modelId": self.id,
            "author": self.id.split("/")[0],
            "downloads": int(self.data.get("downloads", 0)),
            "likes": int(self.data.get("likes", 0)),
            "tags": list(self.data.get("tags", [])),
            "library_name": self.data.get("library_name"),
            "private": False,
            "gated": "manual" if self.data.get("gated") else False,
            "createdAt": "2025-07-31T00:00:00.000Z",
        }

    def info(self, blobs: bool) -> dict[str, Any]:
        """What model_info returns: the summary, the commit, and the files (with sizes when asked)."""
        siblings = []
        for f in self.files.values():
            entry: dict[str, Any] = {"rfilename": f.name}
            if blobs:
                entry |= {"size": f.size, "blobId": f.etag[:40]}
                if f.is_lfs:
                    entry["lfs"] = {"size": f.size, "sha256": f.etag, "pointerSize": 134}
            siblings.append(entry)
        info = self.summary() | {"sha": self.sha, "siblings": siblings, "lastModified": "2025-08-01T00:00:00.000Z"}
        if "gguf" in self.data:
            info["gguf"] = self.data["gguf"]
        if "cardData" in self.data:
            info["cardData"] = self.data["cardData"]
        return info


def load_repos(real: dict[str, Path] | None = None, directory: Path = DATA / "repos") -> dict[str, HubRepo]:
    repos = [HubRepo(json.loads(path.read_text()), real or {}) for path in sorted(directory.glob("*.json"))]
    return {repo.id.lower(): repo for repo in repos}


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers={"X-Error-Code": code})


class LocalHub:
    """The routes; ``requests`` records (method, path, Range) for tests that check what was fetched."""

    def __init__(self, repos: dict[str, HubRepo]) -> None:
        self.repos = repos
        self.requests: list[tuple[str, str, str]] = []
        # request path → bytes after which the next GET of it breaks off (a dropped connection, once)
        self.cut_once: dict[str, int] = {}
        # request path → the test's own answer (a malicious hub), looked at before the routes
        self.hostile: dict[str, Callable[[Request], Awaitable[Response]]] = {}
        self.routes = Starlette(
            routes=[
                Route("/api/models", self.list_models, methods=["GET"]),
                Route("/api/models/{org}/{name}/paths-info/{rev}", self.paths_info, methods=["POST"]),
                Route("/api/models/{org}/{name}/revision/{rev}", self.model_info, methods=["GET"]),
                Route("/api/models/{org}/{name}/tree/{rev}", self.tree, methods=["GET"]),
                Route("/api/models/{org}/{name}/tree/{rev}/{path:path}", self.tree, methods=["GET"]),
                Route("/api/models/{org}/{name}", self.model_info, methods=["GET"]),
                Route("/{org}/{name}/resolve/{rev}/{path:path}", self.resolve, methods=["GET", "HEAD"]),
            ]
        )

    async def app(self, scope: Any, receive: Any, send: Any) -> None:
        """The routes, unless a test gave this path an answer of its own."""
        answer = self.hostile.get(scope["path"]) if scope["type"] == "http" else None
        if answer is None:
            await self.routes(scope, receive, send)
            return
        request = Request(scope, receive)
        self.requests.append((request.method, request.url.path, request.headers.get("range", "")))
        await (await answer(request))(scope, receive, send)

    def _repo(self, request: Request, files: bool = False) -> HubRepo | Response:
        self.requests.append((request.method, request.url.path, request.headers.get("range", "")))
        repo = self.repos.get(f"{request.path_params['org']}/{request.path_params['name']}".lower())
        if repo is None:
            return _error(404, "RepoNotFound", "Repository not found")
        if files and repo.data.get("gated") and not request.headers.get("authorization"):
            return _error(401, "GatedRepo", f"Access to model {repo.id} is restricted. You must have access to it.")
        return repo

    async def list_models(self, request: Request) -> Response:
        self.requests.append((request.method, str(request.url.path) + "?" + request.url.query, ""))
        params = request.query_params
        wanted = params.getlist("filter")
        author = params.get("author")
        search = (params.get("search") or "").lower()
        found = [
            repo
            for repo in self.repos.values()
            if all(tag in repo.data.get("tags", []) for tag in wanted)
            and (not author or repo.id.split("/")[0].lower() == author.lower())
            and search in repo.id.lower()
        ]
        found.sort(key=lambda repo: -int(repo.data.get("downloads", 0)))
        limit = int(params.get("limit") or 1000)
        return JSONResponse([repo.summary() for repo in found[:limit]])

    async def model_info(self, request: Request) -> Response:
        repo = self._repo(request)
        if isinstance(repo, Response):
            return repo
        return JSONResponse(repo.info(blobs=request.query_params.get("blobs", "").lower() == "true"))

    @staticmethod
    def _entry(f: HubFile) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "file", "path": f.name, "size": f.size, "oid": f.etag[:40]}
        if f.is_lfs:
            entry["lfs"] = {"oid": f.etag, "size": f.size, "pointerSize": 134}
        return entry

    async def paths_info(self, request: Request) -> Response:
        repo = self._repo(request)
        if isinstance(repo, Response):
            return repo
        form = urllib.parse.parse_qs((await request.body()).decode())  # the client posts a urlencoded form
        paths = form.get("paths", [])
        return JSONResponse([self._entry(repo.files[path]) for path in paths if path in repo.files])

    async def tree(self, request: Request) -> Response:
        """``list_repo_tree`` (HfFileSystem's ``ls``/``info``): the files directly under a folder."""
        repo = self._repo(request)
        if isinstance(repo, Response):
            return repo
        folder = request.path_params.get("path", "").strip("/")
        prefix = f"{folder}/" if folder else ""
        entries = [
            self._entry(f)
            for name, f in repo.files.items()
            if name.startswith(prefix) and "/" not in name[len(prefix) :]
        ]
        return JSONResponse(entries)

    async def resolve(self, request: Request) -> Response:
        repo = self._repo(request, files=True)
        if isinstance(repo, Response):
            return repo
        f = repo.files.get(request.path_params["path"])
        if f is None:
            return _error(404, "EntryNotFound", f"{request.path_params['path']} does not exist in {repo.id}")
        headers = {
            "ETag": f'"{f.etag}"',
            "X-Repo-Commit": repo.sha,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        start, end = 0, f.size
        status = 200
        if (wanted := request.headers.get("range", "")).startswith("bytes="):
            first, _, last = wanted[6:].partition("-")
            start = int(first) if first else max(0, f.size - int(last))
            end = min(f.size, int(last) + 1) if first and last else f.size
            if start >= f.size:
                return Response(status_code=416, headers={"Content-Range": f"bytes */{f.size}"})
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{f.size}"
        headers["Content-Length"] = str(end - start)
        if request.method == "HEAD":
            return Response(status_code=status, headers=headers)

        cut = self.cut_once.pop(request.url.path, None)

        def body() -> Iterator[bytes]:
            for at in range(start, end, CHUNK):
                stop = min(end, at + CHUNK)
                if cut is not None and stop > start + cut:
                    yield f.read(at, start + cut)
                    raise ConnectionResetError("the local hub drops this download once, as asked")
                yield f.read(at, stop)

        return StreamingResponse(body(), status_code=status, headers=headers)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running(real: dict[str, Path] | None = None, port: int | None = None) -> Iterator[tuple[str, LocalHub]]:
    """The hub on 127.0.0.1 in a thread, for as long as the block runs: (endpoint URL, hub)."""
    hub = LocalHub(load_repos(real))
    port = port or free_port()
    server = WakeableServer(
        uvicorn.Config(hub.app, host="127.0.0.1", port=port, log_level="warning", interface="asgi3")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(
        lambda: server.started,
        what="the local hub to start",
        timeout_s=10,
        abort=lambda: None if thread.is_alive() else "its thread ended",
    )
    try:
        yield f"http://127.0.0.1:{port}", hub
    finally:
        server.stop()
        thread.join(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--real", action="append", default=[], help="NAME=PATH of a real file (repeatable)")
    args = parser.parse_args()
    real = {name: Path(path) for name, _, path in (item.partition("=") for item in args.real)}
    hub = LocalHub(load_repos(real))
    print(f"HF_ENDPOINT=http://127.0.0.1:{args.port}", flush=True)
    uvicorn.run(hub.app, host="127.0.0.1", port=args.port, log_level="warning", interface="asgi3")


if __name__ == "__main__":
    main()
