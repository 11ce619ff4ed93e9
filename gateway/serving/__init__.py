"""The HTTP surface agents talk to, in front of whatever ``supervision.lifecycle`` says is served.

Rooms, bottom first (``ROOMS`` below is their order, which the layer test reads): ``wire`` (errors, SSE, usage
figures, the request id: what every room reads and writes), then ``dialects`` (the APIs and their
translations), ``transport`` (the client to the engine) and ``scheduling`` (sessions, admission, usage figures
per key), which do not import each other, then ``routing`` (which replica a request goes to, when several
serve), then ``edge`` (the ASGI layers). At the top, the floor that ties them together: ``runtime`` (what the
app serves, in one value), ``handlers`` (the inference routes), ``metrics`` (``/metrics`` read from the
runtime), ``drain`` (stopping it without dropping anyone) and ``app`` (routes, lifespan, the edge around
them). Never names an engine.
"""

# Bottom first; rooms of one tuple do not import each other; "" is serving's own top floor.
ROOMS: tuple[tuple[str, ...], ...] = (
    ("wire",),
    ("dialects", "transport", "scheduling"),
    ("routing",),
    ("edge",),
    ("",),
)
