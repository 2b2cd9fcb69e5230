"""A limit on guessing the API key: GUESS_LIMIT wrong keys from one client within GUESS_WINDOW_S,
and every key that client presents is refused (429 with Retry-After) until the oldest of them
is older than the window.

A wrong key is an API key that does not match (a header, the WebSocket subprotocol or
?api_key=, and the page's sign-in form) or an ephemeral key the server never issued. Keys the
server issued and that have expired are not guesses (a client still holding one is not
guessing), nor is a request without a key. While a client is refused, its right key is refused
too: otherwise the refusals would only tell a guesser which of its guesses was right.

A client is its address (inputs/client_address.py), so clients sharing one (a NAT, a proxy that
is not among `server.trusted_proxies`) share the limit; an IPv6 client is counted by its /64 (a
host is commonly given a whole /64 and may send from any address in it). This machine's own
clients (loopback, or a Unix socket) are not counted: whoever runs there can read the key
where the server does, and local tools and tests try keys freely. Each instance of a fleet
counts on its own.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections import deque
from collections.abc import Callable

from kimiaudio.server.api_error import ApiError
from kimiaudio.server.inputs.client_address import Address

log = logging.getLogger("kimiaudio.server")

GUESS_LIMIT = 10
GUESS_WINDOW_S = 600.0
MAX_CLIENTS = 65536  # clients remembered at once; beyond it the longest-remembered is forgotten


class KeyGuesses:
    """The wrong keys of each client within the window. Used on the event loop only."""

    def __init__(
        self, limit: int = GUESS_LIMIT, window_s: float = GUESS_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ):
        self.limit, self.window_s, self.clock = limit, window_s, clock
        self._wrong: dict[str, deque[float]] = {}  # client -> when its last `limit` wrong keys came

    def check(self, address: Address | None) -> None:
        """Refuse (429) a key from the client at `address` while it has had `limit` wrong keys
        within the window."""
        client = _client(address)
        wait = 0.0 if client is None else self._refused_for(client)
        if wait > 0:
            raise ApiError(
                429,
                "too_many_wrong_keys",
                f"too many wrong API keys from this address: no key is accepted from it for {math.ceil(wait)} s",
                headers={"Retry-After": str(math.ceil(wait))},
            )

    def wrong(self, address: Address | None) -> None:
        """Count a wrong key from the client at `address`."""
        client = _client(address)
        if client is None:
            return
        now = self.clock()
        times = self._wrong.pop(client, None)  # re-inserted last: the dict stays in order of activity
        if times is None:
            self._forget_beyond(MAX_CLIENTS - 1, now)
            times = deque(maxlen=self.limit)
        times.append(now)
        self._wrong[client] = times
        if len(times) == self.limit:
            log.warning(
                "%d wrong API keys from %s within %.0f s: its keys are refused for now",
                self.limit,
                client,
                self.window_s,
            )

    def _refused_for(self, client: str) -> float:
        times = self._wrong.get(client)
        if times is None or len(times) < self.limit:
            return 0.0
        return times[0] + self.window_s - self.clock()

    def _forget_beyond(self, room: int, now: float) -> None:
        """Keep at most `room` clients: those whose newest wrong key has left the window go first,
        then the least recently seen."""
        if len(self._wrong) <= room:
            return
        for client in [c for c, times in self._wrong.items() if times[-1] + self.window_s <= now]:
            del self._wrong[client]
        while len(self._wrong) > room:
            del self._wrong[next(iter(self._wrong))]


def _client(address: Address | None) -> str | None:
    """Whom a wrong key from `address` is counted against: its IPv4 address or IPv6 /64; None for
    this machine."""
    if address is None or address.is_loopback:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)
