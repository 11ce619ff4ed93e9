"""The HTTP surface agents talk to, in front of whatever ``supervision.lifecycle`` says is served.

Outside in: ``listen`` (the socket), ``http_limits``, ``disconnect``, ``edge`` (API keys, request
ids and metrics) and ``browser_guard`` (pure ASGI layers), ``app`` (routes, lifespan, ``readiness``)
and ``handlers`` (inference routes), ``request_body``, ``request_shapes`` and ``error_shapes`` (what
each route reads, and its errors in its own dialect), ``admission`` (slots and the queue),
``model_names``, the translations (``responses_api``, ``messages_api``, ``chat_stream``, ``chat_fixups``,
``sse``, ``stream_guard``), ``proxy`` (forwarding with its clocks and limits), ``drain``, ``metrics``,
``status_page``, ``external`` (a server the user runs) and ``runtime`` (what the app serves). Never
names an engine.
"""
