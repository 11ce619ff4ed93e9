"""The ASGI edge, outside in: the listening socket (``listen``), header caps, client clocks and the
connection cap (``http_limits``), a client's disconnect (``disconnect``), API keys, request ids, metrics
and the access log (``middleware``), Host, content type and Origin (``browser_guard``), a request body
read with its cost bounded (``request_body``), and what ``/ready`` and ``/status`` say (``readiness``,
``status_page``). Below the routes: it reads the dialects' request shapes and fills the scheduler's
records; it never imports the routes."""
