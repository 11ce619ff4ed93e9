"""`--backend-url` does not throttle silently: capacity is what the server says, what the user set,
or nothing at all (the server's own 429/503 pass through)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.backends.base import Capability
from gateway.cli.full_settings import Settings
from gateway.core.errors import ConfigError
from gateway.supervision.external import UNLIMITED, describe_server
from tests.unit.http_harness import Served


def _server(slots: int | None) -> Starlette:
    async def models(_request: Request) -> Response:
        return JSONResponse({"data": [{"id": "served-model", "max_model_len": 4096}]})

    async def props(_request: Request) -> Response:
        return JSONResponse({"total_slots": slots}) if slots else Response(status_code=404)

    return Starlette(routes=[Route("/v1/models", models), Route("/props", props)])


@pytest.fixture(params=[4, None], ids=["llama-server", "no-props"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[Served, int | None]]:
    served = Served(_server(request.param), lifespan="off")
    try:
        yield served, request.param
    finally:
        served.stop()


def test_capacity_is_the_servers_own_or_unlimited(server: tuple[Served, int | None]) -> None:
    served, slots = server
    launch, fronted = describe_server(Settings(backend_url=served.url + "/v1"))
    assert fronted == "served-model" and launch.context_length == 4096
    assert launch.max_concurrency == (slots or UNLIMITED)


def test_a_configured_capacity_wins(server: tuple[Served, int | None]) -> None:
    served, _ = server
    launch, _ = describe_server(Settings(backend_url=served.url, backend_max_concurrency=2))
    assert launch.max_concurrency == 2


def test_native_apis_are_read_into_capabilities_and_a_typo_is_refused() -> None:
    """The words of --backend-native-apis become the engine's capabilities; one that names none (a typo
    the gateway would otherwise ignore, translating what the server does itself) is refused before it is
    asked, naming the known ones."""
    launch, _ = describe_server(
        Settings(
            backend_url="http://127.0.0.1:9",
            model="m",
            context_length=4096,
            backend_max_concurrency=1,
            backend_native_apis=["messages"],
        )
    )
    assert launch.native == {Capability.MESSAGES}
    with pytest.raises(ConfigError, match="unknown mesages; known: include_usage, max_completion_tokens"):
        describe_server(Settings(backend_url="http://127.0.0.1:9", backend_native_apis=["mesages"]))
