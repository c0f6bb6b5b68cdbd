"""What several test files share: a local HTTP server for a handler, run in a thread for the length of a block."""

from __future__ import annotations

import contextlib
import http.server
import threading
from typing import Iterator


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """A request handler that prints no line per request."""

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def http_server(handler) -> Iterator[str]:
    """`handler` (a request handler class, or a factory of one) served on 127.0.0.1 at a free port; yields its base
    URL, http://127.0.0.1:<port>, and stops the server when the block ends."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
