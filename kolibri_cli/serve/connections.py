"""uvicorn's HTTP protocol with bounds against clients that open connections and never finish a
request (slowloris): a request's headers must arrive within `header_s` of the connection (or of
the first byte of a next request on a kept-alive one), else 408 and the connection closes; and
one client address may keep at most `per_client` connections waiting for headers — past that
its oldest, once older than GRACE_S (a burst of real clients is let through), are closed. So
hundreds of idle connections from one address hold neither the connection limit nor anyone's
/health, and idle connections from many addresses last `header_s` each.
Non-goals: rate limits, slow bodies (app.py bounds the body's read), TLS.
"""

from uvicorn.protocols.http.auto import AutoHTTPProtocol

HEADER_S = 10.0  # nginx's client_header_timeout is 60 s; a real client sends them at once
PER_CLIENT = 32  # connections one address may keep waiting for headers
GRACE_S = 1.0  # a connection this young is not closed for the cap
TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"


def bounded_protocol(header_s: float = HEADER_S, per_client: int = PER_CLIENT) -> type:
    """uvicorn's protocol class (`Config(http=...)`) with the bounds; its own record of the
    connections waiting, per client address, oldest first."""
    waiting: dict[str, dict] = {}  # address -> {connection: when it began waiting}
    sweeps: set[str] = set()  # addresses with a sweep scheduled

    def sweep(address: str, loop) -> None:
        sweeps.discard(address)
        peers = waiting.get(address, {})
        excess = len(peers) - per_client
        old = [c for c, since in peers.items() if loop.time() - since >= GRACE_S][:excess]
        for connection in old:
            connection.close_waiting()
        if len(peers) > per_client and address not in sweeps:
            sweeps.add(address)
            loop.call_later(GRACE_S, sweep, address, loop)

    class Bounded(AutoHTTPProtocol):
        _timer = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._wait()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not None and not self.cycle.response_complete:
                self._done_waiting()  # the headers are in: a request is being answered
            elif self._timer is None and not self.transport.is_closing():
                self._wait()  # the first bytes of a next request on a kept-alive connection

        def connection_lost(self, exc) -> None:
            self._done_waiting()
            super().connection_lost(exc)

        @property
        def _address(self) -> str:
            return self.client[0] if self.client else ""

        def _wait(self) -> None:
            self._timer = self.loop.call_later(header_s, self._late)
            peers = waiting.setdefault(self._address, {})
            peers[self] = self.loop.time()
            if len(peers) > per_client:
                sweep(self._address, self.loop)

        def _done_waiting(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            peers = waiting.get(self._address)
            if peers is not None:
                peers.pop(self, None)
                if not peers:
                    del waiting[self._address]

        def _late(self) -> None:
            self._timer = None
            if not self.transport.is_closing():
                self.transport.write(TIMEOUT)
            self.close_waiting()

        def close_waiting(self) -> None:
            self._done_waiting()
            self.transport.close()

    return Bounded
