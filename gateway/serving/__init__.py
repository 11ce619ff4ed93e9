"""The HTTP surface agents talk to, in front of whatever ``supervision.lifecycle`` says is served.

Rooms, bottom first: ``wire`` (errors, SSE, usage figures, the request id: what every room reads and
writes), then ``dialects`` (the APIs and their translations), ``transport`` (the client to the engine)
and ``scheduling`` (sessions, admission, usage figures per key), which do not import each other, then
``routing`` (which replica a request goes to, when several serve), then ``edge`` (the ASGI layers). At
the top, the floor that ties them together: ``runtime`` (what the app serves, in one value),
``handlers`` (the inference routes), ``metrics`` (``/metrics`` read from the runtime), ``drain``
(stopping it without dropping anyone) and ``app`` (routes, lifespan, the edge around them). Never names
an engine.
"""
