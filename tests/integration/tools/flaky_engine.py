"""Named stand-in for an engine that starts, serves, then dies of a GPU memory failure at run time
(what no real engine does on demand here). Answers /health and /v1/models until it prints a CUDA
OOM line and exits 1. Reads --port from its arguments; ignores the rest.

    python flaky_engine.py [engine args...] --port PORT [--die-after SECONDS]
"""

from __future__ import annotations

import http.server
import os
import sys
import threading
import time

args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
die_after = float(args[args.index("--die-after") + 1]) if "--die-after" in args else 1.0


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"object": "list", "data": [{"id": "m"}]}')

    def log_message(self, *args: object) -> None:
        pass


def die() -> None:
    time.sleep(die_after)  # the stand-in's life before it dies, not a wait
    line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has 15.47 GiB"
    print(line, flush=True)
    os._exit(1)


threading.Thread(target=die, daemon=True).start()
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
