"""A proxy to the test's PostgreSQL that can freeze: frozen, it keeps every
connection open and forwards nothing, and takes new connections without ever
answering them (a network partition where the kernel still acknowledges, a
server that stopped answering). Or hold only the connections open now, new
ones passing (a NAT failover). Or go down: every connection is cut, and new
ones are closed at once (a server restarting, a failover), until it is up again."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

from psycopg.conninfo import conninfo_to_dict, make_conninfo


class FrozenProxy:
    def __init__(self, database_url: str) -> None:
        self._url = database_url
        params = conninfo_to_dict(database_url)
        host, port = str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)
        # The embedded server listens on a Unix socket only.
        self._upstream: str | tuple[str, int] = (
            f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port)
        )
        self.frozen = threading.Event()
        self.refusing = threading.Event()
        #: The sockets of connections held (no byte forwarded) while new ones flow.
        self._held: set[socket.socket] = set()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        """The test database's URL, through the proxy."""
        return make_conninfo(self._url, host="127.0.0.1", port=str(self.port))

    def go_down(self) -> None:
        """Cut every connection and close new ones at once, until :meth:`come_up`."""
        self.refusing.set()
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        self._sockets.clear()

    def hold_open_connections(self) -> None:
        """Forward nothing more on the connections open now, and let new ones
        through (a NAT or load balancer failover: the flows it knew are gone
        without a reset, new ones pass)."""
        self._held.update(self._sockets)

    def come_up(self) -> None:
        self.refusing.clear()

    def close(self) -> None:
        self._closed.set()
        for sock in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refusing.is_set():
                client.close()
                continue
            self._sockets.append(client)
            if self.frozen.is_set():
                continue  # held open, never answered
            try:
                if isinstance(self._upstream, str):
                    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    server.connect(self._upstream)
                else:
                    server = socket.create_connection(self._upstream)
            except OSError:
                client.close()
                continue
            self._sockets.append(server)
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, target), daemon=True).start()

    def _pipe(self, source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                while (self.frozen.is_set() or source in self._held) and not self._closed.is_set():
                    time.sleep(0.05)  # held, never forwarded while frozen
                target.sendall(data)


@contextlib.contextmanager
def frozen_proxy(database_url: str) -> Iterator[FrozenProxy]:
    proxy = FrozenProxy(database_url)
    try:
        yield proxy
    finally:
        proxy.close()
