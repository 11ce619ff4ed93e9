"""The upstream transport: the pooled client to the live engine, relaying requests and streams with
their clocks and limits (``proxy``), a translated stream checked for a proper end (``stream_guard``),
and the engine asked once per request for its prompt's tokens (``prompt_count``). On ``wire`` only: it
knows no dialect (a translator words its errors) and no scheduler (a slot is handed in as a callback)."""
