"""The bytes of an image or audio input, loaded under a ``MediaPolicy``: ``data:`` URLs and bare
base64 (size checked before decoding), ``http(s)://`` (public addresses only by default, the
checked address is the one connected to, redirects re-checked hop by hop, the body streamed
under the size limit, the whole fetch under one deadline) and ``file:`` URLs below one
allowed directory (symlinks resolved, regular files only). The type comes from the bytes
(``api/media/sniff.py``), never from a declared MIME type.

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
from typing import TYPE_CHECKING

from api.media.sniff import (
    DECODABLE,
    HeaderError,
    MediaKind,
    audio_seconds,
    check_image_data,
    describe,
    image_size,
    sniff,
)
from api.media.url import (
    MAX_URL_CHARS,
    IPAddress,
    Refused,
    Target,
    address_refusal,
    check_url_text,
    domain_set,
    file_path,
    networks,
    parse_http_url,
    percent_decode,
    redirect_url,
    show,
    unwrap,
)

if TYPE_CHECKING:
    import httpx

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
        domain_set(self.allowed_domains or ())  # ValueError naming a bad entry
        networks(self.allowed_private_networks)

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


class _ConnectFailed(Refused):
    """No connection to one address (another address of the host may still answer)."""


async def load_media(source: str, expected: MediaKind, policy: MediaPolicy,
                     param: str) -> MediaBytes:
    """The bytes behind ``source`` (``data:``, ``http(s)://`` or ``file:``), which must sniff as
    ``expected`` in a format llama.cpp decodes. Raises ``MediaError`` for anything else."""
    try:
        return await _load(source, expected, policy)
    except Refused as exc:
        raise MediaError(param, str(exc)) from None


def decode_base64_media(data: str, expected: MediaKind, policy: MediaPolicy,
                        param: str) -> MediaBytes:
    """Bare base64 (``input_audio.data``, Anthropic base64 sources; a ``data:`` URL is taken
    too), checked like a ``data:`` URL. Raises ``MediaError``."""
    try:
        if not isinstance(data, str):
            raise Refused("base64 data must be a string")
        if data[:5].lower() == "data:":
            return _accept(_data_url_bytes(data, expected, policy), expected, policy)
        return _accept(_decode_base64(data, expected, policy.limit(expected)), expected,
                       policy)
    except Refused as exc:
        raise MediaError(param, str(exc)) from None


async def _load(source: str, expected: MediaKind, policy: MediaPolicy) -> MediaBytes:
    if not isinstance(source, str):
        raise Refused("the URL must be a string")
    if not source:
        raise Refused("empty URL")
    match = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", source[:64])
    if match is None:
        hint = ("; inline bytes go in a data: URL, data:<mime>;base64,<data>"
                if _BARE_BASE64.match(source) else "")
        raise Refused(f"not an absolute URL: {show(source, 60)} "
                       f"(expected http://, https://, data: or file:{hint})")
    scheme = match.group(1).lower()
    if scheme == "data":
        return _accept(_data_url_bytes(source, expected, policy), expected, policy)
    if scheme not in ("http", "https", "file"):
        raise Refused(f"unsupported URL scheme {show(scheme, 32)} "
                       "(expected http, https, data or file)")
    root = policy.allowed_local_path
    if scheme == "file" and root is None:
        raise Refused("file: URLs are not allowed on this server")
    if len(source) > MAX_URL_CHARS:
        raise Refused(f"URL too long: {len(source)} characters (at most {MAX_URL_CHARS})")
    check_url_text(source)
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
        raise Refused(f"loading the {expected} timed out after "
                       f"{policy.timeout_seconds:g} s") from None
    note = f"; the server said Content-Type {show(content_type, 60)}" if content_type else ""
    return _accept(data, expected, policy, note)


def _accept(data: bytes, expected: MediaKind, policy: MediaPolicy,
            note: str = "") -> MediaBytes:
    """The bytes as ``expected`` media within the policy's pixel / duration limits (read
    from the header: decompression bombs never reach a decoder), or the refusal naming what
    they are instead."""
    noun = "an image" if expected == "image" else "audio"
    found = sniff(data)
    if found is None:
        raise Refused(f"not {noun} ({describe(data)}{note})")
    kind, mime = found
    if kind != expected:
        raise Refused(f"not {noun} ({mime}{note})")
    if mime not in DECODABLE[kind]:
        supported = ", ".join(_format_name(m) for m in DECODABLE[kind])
        raise Refused(f"unsupported {kind} format {mime.split('/')[1]} "
                       f"(supported: {supported})")
    name = _format_name(mime)
    try:
        if kind == "image":
            width, height = image_size(data, mime)
            if width == 0 or height == 0:
                raise Refused(f"corrupt {name}: the header says {width} × {height} pixels")
            if width * height > policy.image_max_pixels:
                raise Refused(f"image too large: {width} × {height} pixels (the limit is "
                               f"{policy.image_max_pixels} pixels)")
            check_image_data(data, mime)
        else:
            seconds = audio_seconds(data, mime)
            if seconds is not None and seconds > policy.audio_max_seconds:
                raise Refused(f"audio too long: {_duration(seconds)} (the limit is "
                               f"{policy.audio_max_seconds:g} s)")
    except HeaderError as exc:
        raise Refused(f"corrupt {name}: {exc}") from None
    return MediaBytes(kind, mime, data)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 1e6 else f"about {seconds:.1e} s"


def _format_name(mime: str) -> str:
    return {"audio/mpeg": "MP3"}.get(mime, mime.split("/")[1].upper())


def _too_large(expected: MediaKind, size: str, limit: int) -> Refused:
    """``size`` says how the size is known: "1234 bytes", "more than 1000 bytes" …"""
    return Refused(f"{expected} too large: {size} (the limit is {limit} bytes)")


# --- data: URLs and base64 -------------------------------------------------------------------

_BASE64_SPACE = re.compile(r"[ \t\r\n]+")


def _data_url_bytes(source: str, expected: MediaKind, policy: MediaPolicy) -> bytes:
    """``data:[<mime>][;params][;base64],<data>``; the declared type is not used."""
    limit = policy.limit(expected)
    comma = source.find(",", 0, 1024)
    if comma < 0:
        raise Refused("malformed data: URL: no ',' after the media type "
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
    data = percent_decode(source[comma + 1:], "data: URL")
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
        text = percent_decode(text, "data: URL").decode("latin-1")
    compact = _BASE64_SPACE.sub("", text)
    if len(compact) % 4 == 1:
        raise Refused("invalid base64 data (its length is not possible for base64)")
    compact += "=" * (-len(compact) % 4)  # missing padding is tolerated
    if len(compact) > (limit + 2) // 3 * 4:
        raise _too_large(expected, _after_decoding(len(compact)), limit)
    try:
        data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        raise Refused("invalid base64 data (characters outside the base64 alphabet, or "
                       "misplaced '=' padding)") from None
    if len(data) > limit:
        raise _too_large(expected, f"{len(data)} bytes", limit)
    return data


# --- http(s) ---------------------------------------------------------------------------------

def check_address(ip: IPAddress, policy: MediaPolicy) -> str | None:
    """Why a fetch under ``policy`` must not connect to ``ip`` ("loopback", "private" …), or
    None when it may: a public address, any address with ``allow_private_addresses``, or one
    in ``allowed_private_networks``."""
    if policy.allow_private_addresses:
        return None
    return address_refusal(ip, policy.allowed_private_networks)


async def _resolve(target: Target) -> list[IPAddress]:
    """Every address of the host (one getaddrinfo, off the event loop)."""
    if target.literal is not None:
        return [target.literal]
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError):
        raise Refused(f"could not resolve the host {show(target.host)}") from None
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
        raise Refused(f"could not resolve the host {show(target.host)}")
    return found


async def _fetch_http(url: str, expected: MediaKind,
                      policy: MediaPolicy) -> tuple[bytes, str]:
    """The body and Content-Type of ``url``, following up to ``max_redirects`` redirects,
    each hop checked (scheme, domain list, every resolved address) before connecting."""
    for hop in range(policy.max_redirects + 1):
        target = parse_http_url(url)
        if (policy.allowed_domains is not None
                and target.host not in domain_set(policy.allowed_domains)):
            where = "redirect target " if hop else ""
            raise Refused(f"{where}host {show(target.host)} is not in the allowed domains")
        addresses = await _resolve(target)
        for ip in addresses:
            why = check_address(ip, policy)
            if why is not None:
                where = "a redirect to " if hop else ""
                shown = f"{ip} ({unwrap(ip)})" if unwrap(ip) != ip else str(ip)
                raise Refused(f"refused {where}{show(target.host)}: it resolves to {shown}, "
                               f"which is {why}, not a public address")
        location, body, content_type = await _get_any(target, addresses, expected, policy)
        if location is None:
            return body, content_type
        if hop == policy.max_redirects:
            break
        url = redirect_url(url, location)
    raise Refused(f"too many redirects (more than {policy.max_redirects})")


async def _get_any(target: Target, addresses: list[IPAddress], expected: MediaKind,
                   policy: MediaPolicy) -> tuple[str | None, bytes, str]:
    """``_get`` from the first of the (all checked) addresses that accepts a connection."""
    for ip in addresses[:-1]:
        try:
            return await _get(target, unwrap(ip), expected, policy)
        except _ConnectFailed:
            continue
    return await _get(target, unwrap(addresses[-1]), expected, policy)


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    import httpx

    return httpx.create_ssl_context()


async def _get(target: Target, ip: IPAddress, expected: MediaKind,
               policy: MediaPolicy) -> tuple[str | None, bytes, str]:
    """One GET to ``ip`` (no second resolution) with the URL's host in ``Host`` and SNI:
    ``(Location, b"", "")`` for a redirect, else ``(None, body, Content-Type)``. Straight
    to httpx's transport: no client-side redirect, cookie or proxy handling."""
    import httpx  # here, not at start-up: httpx imports its CLI's dependencies too

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
    except Refused:
        raise
    except httpx.TimeoutException:
        raise Refused(f"loading the {expected} timed out after "
                       f"{policy.timeout_seconds:g} s") from None
    except httpx.ConnectError as exc:
        raise _ConnectFailed(f"fetching the {expected} from {show(target.host)} failed: "
                             f"{show(str(exc) or 'cannot connect', 160)}") from None
    except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError, OSError, ValueError) as exc:
        detail = str(exc) or type(exc).__name__
        raise Refused(f"fetching the {expected} from {show(target.host)} failed: "
                       f"{show(detail, 160)}") from None


async def _read(response: httpx.Response, expected: MediaKind,
                limit: int) -> tuple[str | None, bytes, str]:
    status = response.status_code
    if status in _REDIRECTS:
        location = response.headers.get("location")
        if location is None:
            raise Refused(f"the server answered HTTP {status} without a Location")
        return location, b"", ""
    if not 200 <= status < 300:
        raise Refused(f"fetching the {expected} failed: the server answered HTTP {status}")
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise Refused(f"compressed responses are not supported "
                       f"(Content-Encoding {show(encoding, 40)})")
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

def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def _read_file(url: str, expected: MediaKind, limit: int, allowed_root: str) -> bytes:
    """The file's bytes if its real path (symlinks followed) lies inside the real allowed
    root and it is a regular file within the limit. Runs on a worker thread."""
    path = file_path(url)
    root = os.path.abspath(allowed_root)
    real_root = os.path.realpath(allowed_root)
    lexical = os.path.normpath(path)
    outside = Refused(f"{show(path)} is outside the directory allowed for file: URLs")
    if not (_inside(lexical, root) or _inside(lexical, real_root)):
        raise outside  # without touching the file system: no probing outside the root
    try:
        real = str(Path(path).resolve(strict=True))
    except FileNotFoundError:
        raise Refused(f"file not found: {show(path)}") from None
    except (OSError, RuntimeError, ValueError):
        raise Refused(f"cannot open {show(path)}") from None
    if not _inside(real, real_root):
        raise outside
    flags = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
             | getattr(os, "O_CLOEXEC", 0))
    try:
        fd = os.open(real, flags)  # non-blocking: opening a FIFO must not wait for a writer
    except OSError as exc:
        raise Refused(f"cannot open {show(path)}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused(f"{show(path)} is not a regular file")
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
        raise Refused(f"cannot read {show(path)}: {exc.strerror}") from None
    finally:
        os.close(fd)
