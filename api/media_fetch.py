"""The bytes of an image or audio input, loaded under a ``MediaPolicy``: ``data:`` URLs and bare
base64 (size checked before decoding), ``http(s)://`` (public addresses only by default, the
checked address is the one connected to, redirects re-checked hop by hop, the body streamed
under the size limit, the whole fetch under one deadline) and ``file:`` URLs below one
allowed directory (symlinks resolved, regular files only). The type comes from the bytes
(``api/media_sniff.py``), never from a declared MIME type.

Every refusal is a ``MediaError`` naming what was wrong and where in the request (``param``);
no other exception escapes for bad input. Async I/O only: no llama.cpp, no engine.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import ipaddress
import math
import os
import re
import socket
import ssl
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias
from urllib.parse import quote, unquote_to_bytes, urljoin, urlsplit

import httpx

from api.media_sniff import (
    DECODABLE,
    HeaderError,
    MediaKind,
    audio_seconds,
    check_image_data,
    describe,
    image_size,
    sniff,
)

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_URL_CHARS = 8192  # http(s) and file: URLs (a data: URL is bounded by the size limit)
_REDIRECTS = (301, 302, 303, 307, 308)
_BARE_BASE64 = re.compile(r"[A-Za-z0-9+/]{64}")
_USER_AGENT = "llamaserve-media-fetch"


@dataclass(frozen=True)
class MediaPolicy:
    """Where media may come from and how much of it. The defaults suit a server on the
    internet: any public http(s) host, no local files, nothing private."""

    image_max_bytes: int = 20 * 1024 * 1024
    audio_max_bytes: int = 100 * 1024 * 1024
    timeout_seconds: float = 10.0  # the whole fetch: resolution, redirects and body
    allowed_domains: tuple[str, ...] | None = None  # exact host names; None = any public host
    allowed_local_path: str | None = None  # the root for file: URLs; None = file: refused
    allow_private_addresses: bool = False  # trusted networks: loopback / private allowed
    max_redirects: int = 5
    # networks allowed although not public (CIDRs, e.g. "10.1.2.0/24" for an internal store)
    allowed_private_networks: tuple[str, ...] = ()
    # what the decoders allocate, read from the header before they run: stb_image holds
    # 3-9 bytes a pixel (a GIF's whole canvas, however few its bytes) and a request keeps
    # its bitmaps until tokenized (16 x 4096^2 x 3 B = 800 MB); mtmd 4 bytes a sample at
    # the projector's rate (16 kHz)
    image_max_pixels: int = 4096 * 4096
    audio_max_seconds: float = 3600.0

    def __post_init__(self) -> None:
        if self.image_max_bytes <= 0 or self.audio_max_bytes <= 0:
            raise ValueError("media size limits must be positive")
        if self.image_max_pixels <= 0 or not (self.audio_max_seconds > 0
                                              and math.isfinite(self.audio_max_seconds)):
            raise ValueError("media image_max_pixels and audio_max_seconds must be positive")
        if not (self.timeout_seconds > 0 and math.isfinite(self.timeout_seconds)):
            raise ValueError("media timeout_seconds must be a positive number")
        if self.max_redirects < 0:
            raise ValueError("media max_redirects must be 0 or more")
        if self.allowed_local_path is not None and not self.allowed_local_path:
            raise ValueError("media allowed_local_path must not be empty")
        _domain_set(self.allowed_domains or ())  # ValueError naming a bad entry
        _networks(self.allowed_private_networks)

    def limit(self, kind: MediaKind) -> int:
        return self.image_max_bytes if kind == "image" else self.audio_max_bytes


@dataclass(frozen=True)
class MediaBytes:
    kind: MediaKind
    mime: str  # sniffed from the bytes
    data: bytes


class MediaError(ValueError):
    """A refused media input: ``message`` says why, ``param`` where in the request."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


class _Refused(Exception):
    """A refusal on its way up to the public function, which adds the ``param``."""


class _ConnectFailed(_Refused):
    """No connection to one address (another address of the host may still answer)."""


async def load_media(source: str, expected: MediaKind, policy: MediaPolicy,
                     param: str) -> MediaBytes:
    """The bytes behind ``source`` (``data:``, ``http(s)://`` or ``file:``), which must sniff as
    ``expected`` in a format llama.cpp decodes. Raises ``MediaError`` for anything else."""
    try:
        return await _load(source, expected, policy)
    except _Refused as exc:
        raise MediaError(param, str(exc)) from None


def decode_base64_media(data: str, expected: MediaKind, policy: MediaPolicy,
                        param: str) -> MediaBytes:
    """Bare base64 (``input_audio.data``, Anthropic base64 sources; a ``data:`` URL is taken
    too), checked like a ``data:`` URL. Raises ``MediaError``."""
    try:
        if not isinstance(data, str):
            raise _Refused("base64 data must be a string")
        if data[:5].lower() == "data:":
            return _accept(_data_url_bytes(data, expected, policy), expected, policy)
        return _accept(_decode_base64(data, expected, policy.limit(expected)), expected,
                       policy)
    except _Refused as exc:
        raise MediaError(param, str(exc)) from None


async def _load(source: str, expected: MediaKind, policy: MediaPolicy) -> MediaBytes:
    if not isinstance(source, str):
        raise _Refused("the URL must be a string")
    if not source:
        raise _Refused("empty URL")
    match = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", source[:64])
    if match is None:
        hint = ("; inline bytes go in a data: URL, data:<mime>;base64,<data>"
                if _BARE_BASE64.match(source) else "")
        raise _Refused(f"not an absolute URL: {_show(source, 60)} "
                       f"(expected http://, https://, data: or file:{hint})")
    scheme = match.group(1).lower()
    if scheme == "data":
        return _accept(_data_url_bytes(source, expected, policy), expected, policy)
    if scheme not in ("http", "https", "file"):
        raise _Refused(f"unsupported URL scheme {_show(scheme, 32)} "
                       "(expected http, https, data or file)")
    root = policy.allowed_local_path
    if scheme == "file" and root is None:
        raise _Refused("file: URLs are not allowed on this server")
    if len(source) > MAX_URL_CHARS:
        raise _Refused(f"URL too long: {len(source)} characters (at most {MAX_URL_CHARS})")
    _check_url_text(source)
    limit = policy.limit(expected)
    try:
        if root is not None and scheme == "file":
            data = await asyncio.wait_for(
                asyncio.to_thread(_read_file, source, expected, limit, root),
                policy.timeout_seconds)
            return _accept(data, expected, policy)
        data, content_type = await asyncio.wait_for(
            _fetch_http(source, expected, policy), policy.timeout_seconds)
    except asyncio.TimeoutError:
        raise _Refused(f"loading the {expected} timed out after "
                       f"{policy.timeout_seconds:g} s") from None
    note = f"; the server said Content-Type {_show(content_type, 60)}" if content_type else ""
    return _accept(data, expected, policy, note)


def _accept(data: bytes, expected: MediaKind, policy: MediaPolicy,
            note: str = "") -> MediaBytes:
    """The bytes as ``expected`` media within the policy's pixel / duration limits (read
    from the header: decompression bombs never reach a decoder), or the refusal naming what
    they are instead."""
    noun = "an image" if expected == "image" else "audio"
    found = sniff(data)
    if found is None:
        raise _Refused(f"not {noun} ({describe(data)}{note})")
    kind, mime = found
    if kind != expected:
        raise _Refused(f"not {noun} ({mime}{note})")
    if mime not in DECODABLE[kind]:
        supported = ", ".join(_format_name(m) for m in DECODABLE[kind])
        raise _Refused(f"unsupported {kind} format {mime.split('/')[1]} "
                       f"(supported: {supported})")
    name = _format_name(mime)
    try:
        if kind == "image":
            width, height = image_size(data, mime)
            if width == 0 or height == 0:
                raise _Refused(f"corrupt {name}: the header says {width} × {height} pixels")
            if width * height > policy.image_max_pixels:
                raise _Refused(f"image too large: {width} × {height} pixels (the limit is "
                               f"{policy.image_max_pixels} pixels)")
            check_image_data(data, mime)
        else:
            seconds = audio_seconds(data, mime)
            if seconds is not None and seconds > policy.audio_max_seconds:
                raise _Refused(f"audio too long: {_duration(seconds)} (the limit is "
                               f"{policy.audio_max_seconds:g} s)")
    except HeaderError as exc:
        raise _Refused(f"corrupt {name}: {exc}") from None
    return MediaBytes(kind, mime, data)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 1e6 else f"about {seconds:.1e} s"


def _format_name(mime: str) -> str:
    return {"audio/mpeg": "MP3"}.get(mime, mime.split("/")[1].upper())


def _too_large(expected: MediaKind, size: str, limit: int) -> _Refused:
    """``size`` says how the size is known: "1234 bytes", "more than 1000 bytes" …"""
    return _Refused(f"{expected} too large: {size} (the limit is {limit} bytes)")


# --- data: URLs and base64 -------------------------------------------------------------------

_BASE64_SPACE = re.compile(r"[ \t\r\n]+")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _data_url_bytes(source: str, expected: MediaKind, policy: MediaPolicy) -> bytes:
    """``data:[<mime>][;params][;base64],<data>``; the declared type is not used."""
    limit = policy.limit(expected)
    comma = source.find(",", 0, 1024)
    if comma < 0:
        raise _Refused("malformed data: URL: no ',' after the media type "
                       "(expected data:<mime>;base64,<data>)")
    header = source[5:comma]
    payload_chars = len(source) - comma - 1
    if header.rsplit(";", 1)[-1].strip().lower() == "base64":
        if payload_chars > _base64_budget(limit):
            raise _too_large(expected, _after_decoding(payload_chars), limit)
        return _decode_base64(source[comma + 1:], expected, limit, percent_encoded=True)
    # percent-encoded bytes: at most 3 characters a byte
    if payload_chars > 3 * limit:
        raise _too_large(expected, f"at least {payload_chars // 3} bytes", limit)
    data = _percent_decode(source[comma + 1:], "data: URL")
    if len(data) > limit:
        raise _too_large(expected, f"{len(data)} bytes", limit)
    return data


def _after_decoding(chars: int) -> str:
    return f"about {chars * 3 // 4} bytes after decoding"


def _base64_budget(limit: int) -> int:
    """The most base64 characters that can decode to ``limit`` bytes, plus room for line
    breaks (MIME-style 64–76 character lines)."""
    exact = (limit + 2) // 3 * 4
    return exact + exact // 16 + 4


def _decode_base64(text: str, expected: MediaKind, limit: int,
                   percent_encoded: bool = False) -> bytes:
    if len(text) > _base64_budget(limit):  # before any work on the text
        raise _too_large(expected, _after_decoding(len(text)), limit)
    if percent_encoded and "%" in text:
        text = _percent_decode(text, "data: URL").decode("latin-1")
    compact = _BASE64_SPACE.sub("", text)
    if len(compact) % 4 == 1:
        raise _Refused("invalid base64 data (its length is not possible for base64)")
    compact += "=" * (-len(compact) % 4)  # missing padding is tolerated
    if len(compact) > (limit + 2) // 3 * 4:
        raise _too_large(expected, _after_decoding(len(compact)), limit)
    try:
        data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        raise _Refused("invalid base64 data (characters outside the base64 alphabet, or "
                       "misplaced '=' padding)") from None
    if len(data) > limit:
        raise _too_large(expected, f"{len(data)} bytes", limit)
    return data


def _percent_decode(text: str, what: str) -> bytes:
    bad = _BAD_PERCENT.search(text)
    if bad is not None:
        raise _Refused(f"bad percent-encoding in the {what} at character {bad.start()}")
    try:
        return unquote_to_bytes(text)
    except UnicodeEncodeError:
        raise _Refused(f"the {what} is not valid Unicode (it has a lone surrogate)") from None


# --- URL text --------------------------------------------------------------------------------

_BAD_URL_CHAR = re.compile(r"[\x00-\x20\x7f\\]")


def _check_url_text(url: str) -> None:
    """Refuse what URL parsers disagree about: lone surrogates, whitespace, control
    characters and backslashes (some parsers read ``\\`` as ``/``)."""
    try:
        url.encode("utf-8")
    except UnicodeEncodeError:
        raise _Refused("the URL is not valid Unicode (it has a lone surrogate)") from None
    bad = _BAD_URL_CHAR.search(url)
    if bad is not None:
        char = bad.group()
        what = ("a space" if char == " " else "a backslash" if char == "\\"
                else "a control character")
        raise _Refused(f"the URL contains {what} at character {bad.start()} "
                       "(percent-encode it)")


def _show(text: str, limit: int = 100) -> str:
    """``text`` quoted for an error message, cut to ``limit`` characters, always encodable."""
    cut = text if len(text) <= limit else text[:limit] + "…"
    return repr(cut.encode("utf-8", "backslashreplace").decode("utf-8"))


# --- http(s) ---------------------------------------------------------------------------------

_HOST_LABELS = re.compile(r"[a-z0-9_-]{1,63}(?:\.[a-z0-9_-]{1,63})*")
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"
_QUERY_SAFE = _PATH_SAFE + "?"


@dataclass(frozen=True)
class _Target:
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


def _normal_host(raw: str) -> tuple[str, IPAddress | None]:
    """A host name as compared, resolved and sent: lower case, no trailing dot, IDNA (ASCII);
    an IP literal in its canonical spelling."""
    host = raw.lower()
    if ":" in host:  # an IPv6 literal (brackets already removed)
        if "%" in host:
            raise _Refused("IPv6 zone identifiers are not allowed in URLs")
        try:
            ip6 = ipaddress.IPv6Address(host)
        except ValueError:
            raise _Refused(f"invalid IPv6 address {_show(raw)}") from None
        return ip6.compressed, ip6
    if host.endswith("."):
        host = host[:-1]
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise _Refused(f"invalid international host name {_show(raw)}") from None
    if len(host) > 253 or not _HOST_LABELS.fullmatch(host):
        raise _Refused(f"invalid host name {_show(raw)}")
    try:
        ip4 = ipaddress.IPv4Address(host)
    except ValueError:
        return host, None
    return str(ip4), ip4


def _parse_http_url(url: str) -> _Target:
    try:
        parts = urlsplit(url)
        hostname, port = parts.hostname, parts.port
    except ValueError:
        raise _Refused(f"malformed URL {_show(url)} (bad host or port)") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise _Refused(f"unsupported URL scheme {_show(scheme, 32)}")
    if "@" in parts.netloc:
        raise _Refused("URLs with a user name or password are not allowed")
    if not hostname:
        raise _Refused(f"the URL has no host: {_show(url)}")
    host, literal = _normal_host(hostname)
    if port is None:
        port = 443 if scheme == "https" else 80
    if port == 0:
        raise _Refused("invalid port 0 in the URL")
    path = quote(parts.path or "/", safe=_PATH_SAFE)
    if parts.query:
        path += "?" + quote(parts.query, safe=_QUERY_SAFE)
    return _Target(scheme, host, port, path, literal)


def _normal_domain(entry: str) -> str:
    raw = entry.strip()
    if raw.startswith("[") and raw.endswith("]"):
        raw = raw[1:-1]
    try:
        return _normal_host(raw)[0]
    except _Refused as exc:
        raise ValueError(f"allowed_domains: {exc}") from None


@functools.lru_cache(maxsize=32)
def _domain_set(domains: tuple[str, ...]) -> frozenset[str]:
    return frozenset(_normal_domain(d) for d in domains)


@functools.lru_cache(maxsize=32)
def _networks(cidrs: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network,
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


def _unwrap(ip: IPAddress) -> IPAddress:
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


def check_address(ip: IPAddress, policy: MediaPolicy) -> str | None:
    """Why a fetch under ``policy`` must not connect to ``ip`` ("loopback", "private" …), or
    None when it may: a public address, any address with ``allow_private_addresses``, or one
    in ``allowed_private_networks``."""
    if policy.allow_private_addresses:
        return None
    plain = _unwrap(ip)
    if any(plain in net for net in _networks(policy.allowed_private_networks)):
        return None
    return _why_not_global(plain)


async def _resolve(target: _Target) -> list[IPAddress]:
    """Every address of the host (one getaddrinfo, off the event loop)."""
    if target.literal is not None:
        return [target.literal]
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError):
        raise _Refused(f"could not resolve the host {_show(target.host)}") from None
    found: list[IPAddress] = []
    for family, _type, _proto, _name, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        try:
            ip = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
        except ValueError:
            continue
        if ip not in found:
            found.append(ip)
    if not found:
        raise _Refused(f"could not resolve the host {_show(target.host)}")
    return found


async def _fetch_http(url: str, expected: MediaKind,
                      policy: MediaPolicy) -> tuple[bytes, str]:
    """The body and Content-Type of ``url``, following up to ``max_redirects`` redirects,
    each hop checked (scheme, domain list, every resolved address) before connecting."""
    for hop in range(policy.max_redirects + 1):
        target = _parse_http_url(url)
        if (policy.allowed_domains is not None
                and target.host not in _domain_set(policy.allowed_domains)):
            where = "redirect target " if hop else ""
            raise _Refused(f"{where}host {_show(target.host)} is not in the allowed domains")
        addresses = await _resolve(target)
        for ip in addresses:
            why = check_address(ip, policy)
            if why is not None:
                where = "a redirect to " if hop else ""
                shown = f"{ip} ({_unwrap(ip)})" if _unwrap(ip) != ip else str(ip)
                raise _Refused(f"refused {where}{_show(target.host)}: it resolves to {shown}, "
                               f"which is {why}, not a public address")
        location, body, content_type = await _get_any(target, addresses, expected, policy)
        if location is None:
            return body, content_type
        if hop == policy.max_redirects:
            break
        url = _redirect_url(url, location)
    raise _Refused(f"too many redirects (more than {policy.max_redirects})")


async def _get_any(target: _Target, addresses: list[IPAddress], expected: MediaKind,
                   policy: MediaPolicy) -> tuple[str | None, bytes, str]:
    """``_get`` from the first of the (all checked) addresses that accepts a connection."""
    for ip in addresses[:-1]:
        try:
            return await _get(target, _unwrap(ip), expected, policy)
        except _ConnectFailed:
            continue
    return await _get(target, _unwrap(addresses[-1]), expected, policy)


def _redirect_url(base: str, location: str) -> str:
    if len(location) > MAX_URL_CHARS:
        raise _Refused(f"redirect Location too long ({len(location)} characters)")
    _check_url_text(location)
    try:
        url = urljoin(base, location)
    except ValueError:
        raise _Refused(f"malformed redirect Location {_show(location)}") from None
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme not in ("http", "https"):
        raise _Refused(f"redirect to a {_show(scheme, 32)} URL is not allowed "
                       "(only http and https)")
    if len(url) > MAX_URL_CHARS:
        raise _Refused(f"redirect URL too long ({len(url)} characters)")
    return url


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    return httpx.create_ssl_context()


async def _get(target: _Target, ip: IPAddress, expected: MediaKind,
               policy: MediaPolicy) -> tuple[str | None, bytes, str]:
    """One GET to ``ip`` (no second resolution) with the URL's host in ``Host`` and SNI:
    ``(Location, b"", "")`` for a redirect, else ``(None, body, Content-Type)``. Straight
    to httpx's transport: no client-side redirect, cookie or proxy handling."""
    netloc = f"[{ip}]" if ip.version == 6 else str(ip)
    extensions: dict[str, object] = {
        "timeout": httpx.Timeout(policy.timeout_seconds).as_dict()}
    if target.scheme == "https":
        extensions["sni_hostname"] = target.host
    try:
        request = httpx.Request(
            "GET", f"{target.scheme}://{netloc}:{target.port}{target.path}",
            headers={"Host": target.host_header, "Accept": f"{expected}/*",
                     "Accept-Encoding": "identity", "User-Agent": _USER_AGENT},
            extensions=extensions)
        async with httpx.AsyncHTTPTransport(
                verify=_tls_context(), trust_env=False,
                limits=httpx.Limits(max_connections=1, max_keepalive_connections=0)) as transport:
            response = await transport.handle_async_request(request)
            try:
                return await _read(response, expected, policy.limit(expected))
            finally:
                await response.aclose()  # unread body: the connection is dropped
    except _Refused:
        raise
    except httpx.TimeoutException:
        raise _Refused(f"loading the {expected} timed out after "
                       f"{policy.timeout_seconds:g} s") from None
    except httpx.ConnectError as exc:
        raise _ConnectFailed(f"fetching the {expected} from {_show(target.host)} failed: "
                             f"{_show(str(exc) or 'cannot connect', 160)}") from None
    except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError, OSError, ValueError) as exc:
        detail = str(exc) or type(exc).__name__
        raise _Refused(f"fetching the {expected} from {_show(target.host)} failed: "
                       f"{_show(detail, 160)}") from None


async def _read(response: httpx.Response, expected: MediaKind,
                limit: int) -> tuple[str | None, bytes, str]:
    status = response.status_code
    if status in _REDIRECTS:
        location = response.headers.get("location")
        if location is None:
            raise _Refused(f"the server answered HTTP {status} without a Location")
        return location, b"", ""
    if not 200 <= status < 300:
        raise _Refused(f"fetching the {expected} failed: the server answered HTTP {status}")
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise _Refused(f"compressed responses are not supported "
                       f"(Content-Encoding {_show(encoding, 40)})")
    length = response.headers.get("content-length", "").strip()
    if length.isdigit() and (len(length) > 18 or int(length) > limit):
        declared = length if len(length) <= 18 else "more than 10^18"
        raise _too_large(expected, f"the server declares {declared} bytes", limit)
    chunks: list[bytes] = []
    received = 0
    async for chunk in response.aiter_raw():
        received += len(chunk)
        if received > limit:  # stop reading here
            raise _too_large(expected, f"more than {limit} bytes", limit)
        chunks.append(chunk)
    return None, b"".join(chunks), response.headers.get("content-type", "")


# --- file: -----------------------------------------------------------------------------------

def _file_path(url: str) -> str:
    """The local path of a ``file:`` URL: ``file:///p``, ``file:/p``, ``file://localhost/p``;
    percent-decoded (any bytes, as the file system takes them)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        raise _Refused(f"malformed file: URL {_show(url)}") from None
    if "?" in url or "#" in url:
        raise _Refused("file: URLs take no query or fragment (percent-encode '?' and '#')")
    if parts.netloc and parts.netloc.lower() != "localhost":
        raise _Refused(f"file: URLs naming a host ({_show(parts.netloc)}) are not allowed")
    if not parts.path.startswith("/"):
        raise _Refused("the path of a file: URL must be absolute (file:///dir/name)")
    raw = _percent_decode(parts.path, "file: URL")
    if b"\x00" in raw:
        raise _Refused("the path of the file: URL contains a NUL byte")
    return "/" + os.fsdecode(raw).lstrip("/")


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def _read_file(url: str, expected: MediaKind, limit: int, allowed_root: str) -> bytes:
    """The file's bytes if its real path (symlinks followed) lies inside the real allowed
    root and it is a regular file within the limit. Runs on a worker thread."""
    path = _file_path(url)
    root = os.path.abspath(allowed_root)
    real_root = os.path.realpath(allowed_root)
    lexical = os.path.normpath(path)
    outside = _Refused(f"{_show(path)} is outside the directory allowed for file: URLs")
    if not (_inside(lexical, root) or _inside(lexical, real_root)):
        raise outside  # without touching the file system: no probing outside the root
    try:
        real = str(Path(path).resolve(strict=True))
    except FileNotFoundError:
        raise _Refused(f"file not found: {_show(path)}") from None
    except (OSError, RuntimeError, ValueError):
        raise _Refused(f"cannot open {_show(path)}") from None
    if not _inside(real, real_root):
        raise outside
    flags = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
             | getattr(os, "O_CLOEXEC", 0))
    try:
        fd = os.open(real, flags)  # non-blocking: opening a FIFO must not wait for a writer
    except OSError as exc:
        raise _Refused(f"cannot open {_show(path)}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _Refused(f"{_show(path)} is not a regular file")
        if info.st_size > limit:
            raise _too_large(expected, f"{info.st_size} bytes", limit)
        chunks: list[bytes] = []
        remaining = limit + 1  # one byte more tells a file that grew since fstat
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        if remaining <= 0:
            raise _too_large(expected, f"more than {limit} bytes", limit)
        return b"".join(chunks)
    except OSError as exc:
        raise _Refused(f"cannot read {_show(path)}: {exc.strerror}") from None
    finally:
        os.close(fd)
