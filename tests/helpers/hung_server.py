"""A TCP server that accepts connections and never answers: a hung endpoint, as seen by a client.

Also a proxy that goes silent on demand (a server that hangs mid-run), and a closed port
(nothing listens: a server that is simply down).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def _accepting(on_connection: Callable[[socket.socket, list[socket.socket]], None]) -> Iterator[str]:
    """Accept connections on a free port of 127.0.0.1 and hand each to ``on_connection``.

    Yields the server's URL; every socket in the shared list is closed at the end.
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.settimeout(0.2)  # accept() wakes up to see the stop event
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            held.append(conn)
            on_connection(conn, held)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


@contextmanager
def hung_server() -> Iterator[str]:
    """Yield ``http://127.0.0.1:PORT`` of a server that accepts and then stays silent."""
    with _accepting(lambda conn, held: None) as url:  # kept open, never read or answered
        yield url


def closed_port() -> str:
    """``http://127.0.0.1:PORT`` where nothing listens (connections are refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@contextmanager
def hanging_proxy(target: str) -> Iterator[tuple[str, threading.Event]]:
    """A TCP proxy to ``target`` (``http://host:port``) that goes silent once the event is set.

    Yields the proxy's URL and the event: before it is set, requests pass through; after,
    whatever a client sends is swallowed and it never hears back (a server that hung).
    """
    host, port = target.removeprefix("http://").rsplit(":", 1)
    hang = threading.Event()

    def pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if not hang.is_set():
                    dst.sendall(data)
        except OSError:
            pass

    def forward(conn: socket.socket, held: list[socket.socket]) -> None:
        if hang.is_set():
            return
        upstream = socket.create_connection((host, int(port)))
        held.append(upstream)
        for a, b in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    with _accepting(forward) as url:
        yield url, hang
