"""Where a webhook may point: public addresses, and private ones only when allowed.

A webhook receives signed commands, so a target on loopback, link-local (cloud metadata
services), private, multicast or reserved addresses is refused unless it lies in an
allowed network. ``target_problem`` decides on addresses already resolved; ``resolve``
does the lookup, so a poster can check the addresses it is about to connect to.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def parse_networks(networks: Iterable[str]) -> tuple[IPNetwork, ...]:
    """CIDR strings (``127.0.0.0/8``, ``::1/128``, or one address) as networks."""
    return tuple(ipaddress.ip_network(network, strict=False) for network in networks)


def host_of(url: str) -> str | None:
    """The host of ``url`` without brackets; None when it has none."""
    return urlsplit(url).hostname or None


def address_problem(address: IPAddress, allowed: Sequence[IPNetwork]) -> str | None:
    """None when a webhook may connect to ``address``, else why not."""
    mapped = getattr(address, "ipv4_mapped", None)
    address = mapped or address
    if any(address.version == network.version and address in network for network in allowed):
        return None
    if address.is_global and not address.is_multicast:
        return None
    for kind in ("loopback", "link_local", "private", "multicast", "reserved", "unspecified"):
        if getattr(address, f"is_{kind}"):
            return f"{address} is a {kind.replace('_', '-')} address"
    return f"{address} is not a public address"


def target_problem(url: str, addresses: Iterable[str],
                   allowed: Sequence[IPNetwork] = ()) -> str | None:
    """None when every address ``url``'s host resolved to may be posted to, else why not."""
    if urlsplit(url).scheme not in ("http", "https"):
        return "a webhook is an http or https URL"
    resolved = list(addresses)
    if not resolved:
        return f"{host_of(url)!r} resolves to no address"
    for text in resolved:
        try:
            address = ipaddress.ip_address(text.split("%", 1)[0])  # an IPv6 zone aside
        except ValueError:
            return f"{text!r} is not an IP address"
        problem = address_problem(address, allowed)
        if problem is not None:
            return f"refused webhook target: {problem}; allow its network in the gateway's " \
                   "webhook_allowed_networks to post there"
    return None


def resolve(url: str) -> list[str]:
    """The addresses ``url``'s host resolves to (blocking: call it off the event loop);
    empty when it does not resolve."""
    host = host_of(url)
    if host is None:
        return []
    try:
        return sorted({info[4][0] for info in socket.getaddrinfo(host, None)})
    except (socket.gaierror, UnicodeError):
        return []


def check_target(url: str, allowed: Sequence[IPNetwork] = ()) -> str | None:
    """``target_problem`` on the addresses ``url`` resolves to now."""
    return target_problem(url, resolve(url), allowed)
