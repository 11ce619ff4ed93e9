"""What every floor of serving reads and writes on the wire, in every dialect: errors in each route's
shape (``error_shapes``), server-sent events (``sse``), the engine's usage figures (``usage``) and each
request's tally of them (``usage_tally``), and the request's id (``request_id``). Imports no other room."""
