"""A TCP server that accepts connections and never answers: a hung endpoint, as seen by a client.

Also a closed port (nothing listens), for servers that are simply down.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def hung_server() -> Iterator[str]:
    """Yield ``http://127.0.0.1:PORT`` of a server that accepts and then stays silent."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            held.append(conn)  # kept open, never read from or written to

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


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
    stop = threading.Event()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.settimeout(0.2)
    held: list[socket.socket] = []

    def pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if not hang.is_set():
                    dst.sendall(data)
        except OSError:
            pass

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            held.append(conn)
            if hang.is_set():
                continue
            upstream = socket.create_connection((host, int(port)))
            held.append(upstream)
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", hang
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()
