"""Which client sent a request, as far as the server can tell.

The client is the connection's peer address, unless that peer is a trusted proxy
(`server.trusted_proxies`; by default this machine, where deploy/haproxy.cfg's front runs
beside the instances). Then it is the address the proxies' X-Forwarded-For header names: the
last entry that is not itself a trusted proxy. Entries before that one are the client's own to
write, so they are never believed.
"""

from __future__ import annotations

import ipaddress

from aiohttp import web

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def trusted_networks(entries: list[str]) -> tuple[Network, ...]:
    """The setting's addresses and networks ("127.0.0.1", "10.0.0.0/8", "::1"; config.py checked
    each)."""
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)


def client_address(request: web.Request, trusted: tuple[Network, ...]) -> Address | None:
    """The address of `request`'s client; None for a peer without one (a Unix socket)."""
    peer = _address(request.remote)
    if peer is None:
        return None
    if _is_trusted(peer, trusted):
        forwarded = [a for a in map(_address, _forwarded_for(request)) if a is not None]
        for hop in reversed(forwarded):
            peer = hop
            if not _is_trusted(hop, trusted):
                break
    return peer


def _forwarded_for(request: web.Request) -> list[str]:
    return [hop.strip() for header in request.headers.getall("X-Forwarded-For", []) for hop in header.split(",")]


def _address(text: str | None) -> Address | None:
    if not text:
        return None
    try:
        address = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _is_trusted(address: Address, trusted: tuple[Network, ...]) -> bool:
    return any(address.version == network.version and address in network for network in trusted)
