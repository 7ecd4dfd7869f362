"""A TCP proxy a test can cut and restore: an outage of a server the test cannot stop itself
(the system's PostgreSQL)."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading

from minder.stream.broker import free_port


class CuttableProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target``; :meth:`cut` drops every connection and
    refuses new ones (connection refused, as from a stopped server) until :meth:`restore`."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None

    def start(self) -> CuttableProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut or closed
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        peers = {client: upstream, upstream: client}
        with selectors.DefaultSelector() as selector:
            for sock in peers:
                selector.register(sock, selectors.EVENT_READ)
            try:
                while True:
                    for key, _ in selector.select():
                        source: socket.socket = key.fileobj  # type: ignore[assignment]
                        data = source.recv(65536)
                        if not data:
                            return
                        peers[source].sendall(data)
            except OSError:
                return
            finally:
                for sock in peers:
                    with contextlib.suppress(OSError):
                        sock.close()

    def cut(self) -> None:
        """Stop listening and reset every open connection."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def restore(self) -> None:
        """Listen again on the same port."""
        self.start()

    def close(self) -> None:
        self.cut()
