"""Which URLs a media fetch may follow and which addresses it may connect to: pure text and
address checks, no I/O (``api/media/fetch.py`` does the fetching).

URL text that parsers disagree about is refused (lone surrogates, whitespace, control
characters, backslashes); a host is compared and resolved in one normal spelling (lower
case, IDNA, canonical IP literals); an address is refused unless globally routable (IPv4
inside IPv6 unwrapped, 6to4 and NAT64 followed) or in the allowed networks. Every refusal
is a ``Refused`` whose text says what was wrong.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
from dataclasses import dataclass
from typing import TypeAlias
from urllib.parse import quote, unquote_to_bytes, urljoin, urlsplit

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_URL_CHARS = 8192  # http(s) and file: URLs (a data: URL is bounded by the size limit)
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


class Refused(Exception):
    """A refused media source; ``api.media.fetch`` adds where in the request it was."""


def percent_decode(text: str, what: str) -> bytes:
    bad = _BAD_PERCENT.search(text)
    if bad is not None:
        raise Refused(f"bad percent-encoding in the {what} at character {bad.start()}")
    try:
        return unquote_to_bytes(text)
    except UnicodeEncodeError:
        raise Refused(f"the {what} is not valid Unicode (it has a lone surrogate)") from None


# --- URL text -------------------------------------------------------------------------------

_BAD_URL_CHAR = re.compile(r"[\x00-\x20\x7f\\]")


def check_url_text(url: str) -> None:
    """Refuse what URL parsers disagree about: lone surrogates, whitespace, control
    characters and backslashes (some parsers read ``\\`` as ``/``)."""
    try:
        url.encode("utf-8")
    except UnicodeEncodeError:
        raise Refused("the URL is not valid Unicode (it has a lone surrogate)") from None
    bad = _BAD_URL_CHAR.search(url)
    if bad is not None:
        char = bad.group()
        what = ("a space" if char == " " else "a backslash" if char == "\\"
                else "a control character")
        raise Refused(f"the URL contains {what} at character {bad.start()} "
                       "(percent-encode it)")


def show(text: str, limit: int = 100) -> str:
    """``text`` quoted for an error message, cut to ``limit`` characters, always encodable."""
    cut = text if len(text) <= limit else text[:limit] + "…"
    return repr(cut.encode("utf-8", "backslashreplace").decode("utf-8"))


_HOST_LABELS = re.compile(r"[a-z0-9_-]{1,63}(?:\.[a-z0-9_-]{1,63})*")
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"
_QUERY_SAFE = _PATH_SAFE + "?"


@dataclass(frozen=True)
class Target:
    scheme: str  # "http" or "https"
    host: str  # ASCII, lower case, no trailing dot; an IPv6 literal without brackets
    port: int
    path: str  # path and query, ASCII, percent-encoded
    literal: IPAddress | None  # the host when it is an IP literal

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def normal_host(raw: str) -> tuple[str, IPAddress | None]:
    """A host name as compared, resolved and sent: lower case, no trailing dot, IDNA (ASCII);
    an IP literal in its canonical spelling."""
    host = raw.lower()
    if ":" in host:  # an IPv6 literal (brackets already removed)
        if "%" in host:
            raise Refused("IPv6 zone identifiers are not allowed in URLs")
        try:
            ip6 = ipaddress.IPv6Address(host)
        except ValueError:
            raise Refused(f"invalid IPv6 address {show(raw)}") from None
        return ip6.compressed, ip6
    if host.endswith("."):
        host = host[:-1]
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise Refused(f"invalid international host name {show(raw)}") from None
    if len(host) > 253 or not _HOST_LABELS.fullmatch(host):
        raise Refused(f"invalid host name {show(raw)}")
    try:
        ip4 = ipaddress.IPv4Address(host)
    except ValueError:
        return host, None
    return str(ip4), ip4


def parse_http_url(url: str) -> Target:
    try:
        parts = urlsplit(url)
        hostname, port = parts.hostname, parts.port
    except ValueError:
        raise Refused(f"malformed URL {show(url)} (bad host or port)") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise Refused(f"unsupported URL scheme {show(scheme, 32)}")
    if "@" in parts.netloc:
        raise Refused("URLs with a user name or password are not allowed")
    if not hostname:
        raise Refused(f"the URL has no host: {show(url)}")
    host, literal = normal_host(hostname)
    if port is None:
        port = 443 if scheme == "https" else 80
    if port == 0:
        raise Refused("invalid port 0 in the URL")
    path = quote(parts.path or "/", safe=_PATH_SAFE)
    if parts.query:
        path += "?" + quote(parts.query, safe=_QUERY_SAFE)
    return Target(scheme, host, port, path, literal)


def _normal_domain(entry: str) -> str:
    raw = entry.strip()
    if raw.startswith("[") and raw.endswith("]"):
        raw = raw[1:-1]
    try:
        return normal_host(raw)[0]
    except Refused as exc:
        raise ValueError(f"allowed_domains: {exc}") from None


@functools.lru_cache(maxsize=32)
def domain_set(domains: tuple[str, ...]) -> frozenset[str]:
    return frozenset(_normal_domain(d) for d in domains)


@functools.lru_cache(maxsize=32)
def networks(cidrs: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network,
                                               ...]:
    try:
        return tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)
    except ValueError as exc:
        raise ValueError(f"allowed_private_networks: {exc}") from None


# not globally routable, whatever this Python's ipaddress says (its tables changed over time)
_NOT_GLOBAL = tuple(ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
    "172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.168.0.0/16", "198.18.0.0/15",
    "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
    "::/8", "64:ff9b:1::/48", "100::/64", "2001::/23", "2001:db8::/32", "fc00::/7",
    "fe80::/10", "fec0::/10", "ff00::/8",
))
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SHARED = ipaddress.IPv4Network("100.64.0.0/10")


def unwrap(ip: IPAddress) -> IPAddress:
    """The IPv4 address inside an IPv4-mapped IPv6 one (``::ffff:127.0.0.1``)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _why_not_global(ip: IPAddress) -> str | None:
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return _why_not_global(ip.ipv4_mapped)
        embedded = ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:  # 6to4 and NAT64 reach the IPv4 address inside
            inner = _why_not_global(embedded)
            return None if inner is None else f"an IPv6 address embedding {embedded} ({inner})"
    for test, what in ((ip.is_unspecified, "unspecified"), (ip.is_loopback, "loopback"),
                       (ip.is_link_local, "link-local"), (ip.is_multicast, "multicast"),
                       (ip in _SHARED, "shared (CGNAT)"),
                       (ip.is_reserved, "reserved"), (ip.is_private, "private")):
        if test:
            return what
    if not ip.is_global or any(ip in net for net in _NOT_GLOBAL):
        return "not globally routable"
    return None


def address_refusal(ip: IPAddress, allowed_networks: tuple[str, ...] = ()) -> str | None:
    """Why a fetch must not connect to ``ip`` ("loopback", "private" …) unless private
    addresses are allowed, or None when it may: a public address, or one in
    ``allowed_networks`` (CIDRs)."""
    plain = unwrap(ip)
    if any(plain in net for net in networks(allowed_networks)):
        return None
    return _why_not_global(plain)


def redirect_url(base: str, location: str) -> str:
    if len(location) > MAX_URL_CHARS:
        raise Refused(f"redirect Location too long ({len(location)} characters)")
    check_url_text(location)
    try:
        url = urljoin(base, location)
    except ValueError:
        raise Refused(f"malformed redirect Location {show(location)}") from None
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme not in ("http", "https"):
        raise Refused(f"redirect to a {show(scheme, 32)} URL is not allowed "
                       "(only http and https)")
    if len(url) > MAX_URL_CHARS:
        raise Refused(f"redirect URL too long ({len(url)} characters)")
    return url


def file_path(url: str) -> str:
    """The local path of a ``file:`` URL: ``file:///p``, ``file:/p``, ``file://localhost/p``;
    percent-decoded (any bytes, as the file system takes them)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        raise Refused(f"malformed file: URL {show(url)}") from None
    if "?" in url or "#" in url:
        raise Refused("file: URLs take no query or fragment (percent-encode '?' and '#')")
    if parts.netloc and parts.netloc.lower() != "localhost":
        raise Refused(f"file: URLs naming a host ({show(parts.netloc)}) are not allowed")
    if not parts.path.startswith("/"):
        raise Refused("the path of a file: URL must be absolute (file:///dir/name)")
    raw = percent_decode(parts.path, "file: URL")
    if b"\x00" in raw:
        raise Refused("the path of the file: URL contains a NUL byte")
    return "/" + os.fsdecode(raw).lstrip("/")
