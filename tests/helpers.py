"""What several test files share: a local HTTP server for a handler, run in a thread for the length of a block; a
port another program holds; a child that takes Ctrl-C as a terminal's would."""

from __future__ import annotations

import contextlib
import http.server
import signal
import socket
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


@contextlib.contextmanager
def taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 that a listening socket holds for the length of a block: another program's."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def as_in_a_terminal() -> None:
    """A `preexec_fn`: SIGINT delivered as a terminal delivers it. A test run started as `nohup ... &` (or by a
    script's background job) ignores SIGINT, and every child would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
