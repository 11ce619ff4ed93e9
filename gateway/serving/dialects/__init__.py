"""The APIs agents speak, and the translations between them: what each route reads (``request_shapes``),
the fronted model name in and the served one out (``model_names``), what every route fixes in a prompt
(``prompt_prefix``), what some engines do not do for chat completions (``chat_fixups``), a streamed chat
completion read once into typed events (``chat_stream``), Responses (``responses_api``,
``responses_events``, ``custom_tools``) and Messages (``messages_api``) to chat completions and back, and
one :class:`~gateway.serving.dialects.dialect.Dialect` value per translated API holding what differs
between them (``dialect``). Pure: on ``wire`` only, never the edge, the transport or the scheduler."""
