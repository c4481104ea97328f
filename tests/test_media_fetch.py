"""api/media/fetch.py against real local servers (http.server threads on 127.0.0.1 and
127.0.0.2, one of them TLS), real files and real sockets — no mock of httpx. Every refusal is a
MediaError naming the problem; private addresses are refused before any connection; the
address checked is the one connected to; the size limit stops reading early; one deadline
holds against trickling servers.

Nothing here leaves the loopback: a module-wide guard fails any test that would connect to
another address, and host names other than localhost are answered by ``FakeDNS`` (a stand-in
for ``socket.getaddrinfo``)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import gzip
import ipaddress
import os
import socket
import ssl
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import media_samples as samples
from api.media import fetch as media_fetch
from api.media.fetch import (
    MediaBytes,
    MediaError,
    MediaPolicy,
    check_address,
    decode_base64_media,
    load_media,
)

MB = 1024 * 1024
HUGE = 50 * MB  # what the oversize endpoints would send if nobody stopped reading
HTML = b"<!DOCTYPE html><html><body><h1>Not an image</h1></body></html>"
DEFAULT = MediaPolicy(timeout_seconds=5)
LOCAL = MediaPolicy(timeout_seconds=5, allowed_private_networks=("127.0.0.1/32",))
PARAM = "messages[0].content[1].image_url.url"
PNG_B64 = base64.b64encode(samples.png()).decode()


# --- servers ---------------------------------------------------------------------------------

class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, port: int = 0, tls: ssl.SSLContext | None = None) -> None:
        super().__init__((host, port), Handler)
        self.scheme = "https" if tls else "http"
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True)
        self.hits: list[tuple[str, str]] = []  # (path, Host header)
        self.sent: dict[str, int] = {}  # body bytes a streaming endpoint wrote, by ?id=
        self.finished: defaultdict[str, threading.Event] = defaultdict(threading.Event)
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def url(self, path: str, host: str | None = None) -> str:
        return f"{self.scheme}://{host or self.server_address[0]}:{self.port}{path}"

    def finish(self, key: str) -> threading.Event:
        with self.lock:
            return self.finished[key]

    def paths(self) -> list[str]:
        with self.lock:
            return [path for path, _ in self.hits]


STATIC: dict[str, tuple[bytes, str]] = {
    "/image.png": (samples.png(), "image/png"),
    "/photo.jpg": (samples.jpeg(), "image/jpeg"),
    "/png-as-text": (samples.png(), "text/plain"),
    "/html-as-png": (HTML, "image/png"),
    "/page.html": (HTML, "text/html"),
    "/sound.wav": (samples.wav(), "audio/wav"),
    "/image.webp": (samples.webp(), "image/webp"),
    "/empty": (b"", "image/png"),
}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        srv = self.server
        with srv.lock:
            srv.hits.append((self.path, self.headers.get("Host", "")))
        path, _, query = self.path.partition("?")
        args = {k: v[0] for k, v in parse_qs(query).items()}
        if path in STATIC:
            self.reply(200, *STATIC[path])
        elif path == "/gzip":
            self.reply(200, gzip.compress(samples.png()), "image/png",
                       {"Content-Encoding": "gzip"})
        elif path.startswith("/status/"):
            self.reply(int(path.rsplit("/", 1)[1]), b"no", "text/plain")
        elif path.startswith("/huge/"):
            self.huge(path.rsplit("/", 1)[1], args.get("id", ""))
        elif path == "/trickle":
            self.trickle(args.get("id", ""))
        elif path == "/stall":
            srv.stopping.wait(6)
            self.reply(200, *STATIC["/image.png"])
        elif path.startswith("/chain/"):
            hops = int(path.rsplit("/", 1)[1])
            if hops == 0:
                self.reply(200, *STATIC["/image.png"])
            else:
                self.redirect(f"/chain/{hops - 1}")
        elif path == "/to":
            self.redirect(args["u"], int(args.get("status", "302")))
        elif path == "/loop":
            self.redirect("/loop")
        elif path == "/nolocation":
            self.reply(302, b"", "text/plain")
        elif path == "/relative/page":
            self.redirect("../image.png", 301)
        else:
            self.reply(404, b"not found", "text/plain")

    def reply(self, status: int, body: bytes, content_type: str,
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def redirect(self, location: str, status: int = 302) -> None:
        self.send_response(status)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def huge(self, framing: str, key: str) -> None:
        """An image body of HUGE bytes, 64 KiB at a time, framed by Content-Length, chunked
        encoding or the connection's end; records how much went out before the client
        hung up."""
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        if framing == "length":
            self.send_header("Content-Length", str(HUGE))
        elif framing == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        first = samples.png()
        piece = first + bytes(64 * 1024 - len(first))
        sent = 0
        try:
            while sent < HUGE and not self.server.stopping.is_set():
                if framing == "chunked":
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                else:
                    self.wfile.write(piece)
                sent += len(piece)
                piece = bytes(len(piece))
                time.sleep(0.0005)
            if framing == "chunked":
                self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client hung up
            pass
        finally:
            self.server.sent[key] = sent
            self.server.finish(key).set()

    def trickle(self, key: str) -> None:
        """Headers at once, then one body byte every 50 ms."""
        body = samples.png() + bytes(100_000)
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.close_connection = True
        sent = 0
        try:
            for byte in body:
                if self.server.stopping.wait(0.05):
                    break
                self.wfile.write(bytes([byte]))
                sent += 1
        except OSError:
            pass
        finally:
            self.server.sent[key] = sent
            self.server.finish(key).set()


@contextlib.contextmanager
def serving(server: Server) -> Iterator[Server]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stopping.set()
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def web() -> Iterator[Server]:
    with serving(Server("127.0.0.1")) as server:
        yield server


@pytest.fixture(scope="module")
def other(web: Server) -> Iterator[Server]:
    """The same port on 127.0.0.2: loopback too, but outside LOCAL's allowed network."""
    with serving(Server("127.0.0.2", web.port)) as server:
        yield server


@pytest.fixture(scope="module", autouse=True)
def only_loopback() -> Iterator[None]:
    """Every connection the code under test makes goes through ``_get`` with the checked
    address; anything but loopback fails the test instead of leaving the machine."""
    real = media_fetch._get

    async def guarded(target: Any, ip: media_fetch.IPAddress, expected: Any,
                      policy: MediaPolicy) -> Any:
        if not ip.is_loopback:
            raise AssertionError(f"the code under test tried to connect to {ip}")
        return await real(target, ip, expected, policy)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(media_fetch, "_get", guarded)
        yield


class FakeDNS:
    """``socket.getaddrinfo`` for the names in ``answers`` (each lookup takes the next answer
    while there are several, then keeps the last); other names go to the real resolver."""

    def __init__(self) -> None:
        self.answers: dict[str, list[list[str]]] = {}
        self.calls: list[str] = []
        self.real = socket.getaddrinfo

    def __call__(self, host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0,
                 flags: int = 0) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name not in self.answers:
            return self.real(host, port, family, type, proto, flags)
        self.calls.append(name)
        queue = self.answers[name]
        ips = queue.pop(0) if len(queue) > 1 else queue[0]
        if not ips:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (ip, int(port), 0, 0)) if ":" in ip
                else (socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, int(port)))
                for ip in ips]


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> FakeDNS:
    fake = FakeDNS()
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return fake


def load(source: str, expected: Any = "image", policy: MediaPolicy = LOCAL) -> MediaBytes:
    return asyncio.run(load_media(source, expected, policy, PARAM))


def refused(source: str, expected: Any = "image", policy: MediaPolicy = LOCAL) -> str:
    with pytest.raises(MediaError) as err:
        load(source, expected, policy)
    assert err.value.param == PARAM and str(err.value) == err.value.message
    assert isinstance(err.value, ValueError)
    err.value.message.encode()  # printable in a JSON error body
    return err.value.message


# --- http(s): content ------------------------------------------------------------------------

def test_png_over_http_with_the_url_host_in_the_host_header(web: Server) -> None:
    media = load(web.url("/image.png"))
    assert media == MediaBytes("image", "image/png", samples.png())
    assert web.hits[-1] == ("/image.png", f"127.0.0.1:{web.port}")
    assert load(web.url("/photo.jpg")).mime == "image/jpeg"
    assert load(web.url("/sound.wav"), "audio") == MediaBytes("audio", "audio/wav",
                                                              samples.wav())


def test_the_declared_content_type_is_not_trusted(web: Server) -> None:
    assert load(web.url("/png-as-text")).mime == "image/png"
    message = refused(web.url("/html-as-png"))
    assert message == ("not an image (looks like HTML; the server said Content-Type "
                       "'image/png')")


@pytest.mark.parametrize("path,expected,words", [
    ("/page.html", "image", "not an image (looks like HTML"),
    ("/empty", "image", "not an image (empty"),
    ("/sound.wav", "image", "not an image (audio/wav"),
    ("/image.png", "audio", "not audio (image/png"),
    ("/image.webp", "image", "unsupported image format webp (supported: PNG, JPEG, GIF, BMP)"),
    ("/gzip", "image", "compressed responses are not supported (Content-Encoding 'gzip')"),
    ("/status/404", "image", "the server answered HTTP 404"),
    ("/status/500", "image", "the server answered HTTP 500"),
    ("/nolocation", "image", "the server answered HTTP 302 without a Location"),
])
def test_refused_responses_name_the_problem(web: Server, path: str, expected: str,
                                            words: str) -> None:
    assert words in refused(web.url(path), expected)


# --- http(s): addresses ----------------------------------------------------------------------

@pytest.mark.parametrize("url", [
    "http://127.0.0.1:{port}/image.png",
    "http://localhost:{port}/image.png",
    "http://LocalHost.:{port}/image.png",
    "http://[::1]:{port}/image.png",
    "http://0.0.0.0:{port}/image.png",
    "http://[::ffff:127.0.0.1]:{port}/image.png",
    "http://[::]:{port}/image.png",
    "http://2130706433:{port}/image.png",  # 127.0.0.1 in decimal
    "http://0177.0.0.1:{port}/image.png",  # octal
    "http://0x7f.1:{port}/image.png",  # hex, short form
    "http://127.1:{port}/image.png",
    "http://10.0.0.1/image.png",
    "http://172.16.5.4/image.png",
    "http://192.168.1.1/image.png",
    "http://169.254.169.254/latest/meta-data/",  # cloud metadata
    "http://100.64.0.1/image.png",
    "http://224.0.0.1/image.png",
    "http://255.255.255.255/image.png",
    "http://[fe80::1]/image.png",
    "http://[fc00::1]/image.png",
    "http://[::ffff:10.0.0.1]/image.png",
    "http://[64:ff9b::a9fe:a9fe]/image.png",  # NAT64 of 169.254.169.254
    "http://[2002:c0a8:101::1]/image.png",  # 6to4 of 192.168.1.1
])
def test_private_addresses_are_refused_by_default(web: Server, url: str) -> None:
    before = len(web.paths())
    message = refused(url.format(port=web.port), policy=DEFAULT)
    assert "not a public address" in message
    assert len(web.paths()) == before  # refused before connecting


@pytest.mark.parametrize("host,host_header", [
    ("127.0.0.1", "127.0.0.1"), ("localhost", "localhost"), ("LocalHost.", "localhost"),
    ("2130706433", "2130706433"), ("127.1", "127.1"), ("[::ffff:127.0.0.1]", "[::ffff:7f00:1]"),
])
def test_private_addresses_are_allowed_on_trusted_networks(web: Server, host: str,
                                                           host_header: str) -> None:
    policy = MediaPolicy(timeout_seconds=5, allow_private_addresses=True)
    assert load(web.url("/image.png", host), policy=policy).mime == "image/png"
    assert web.hits[-1][1] == f"{host_header}:{web.port}"


def test_allowed_private_networks_admit_exactly_their_addresses(web: Server,
                                                                other: Server) -> None:
    assert load(web.url("/image.png")).mime == "image/png"
    message = refused(other.url("/image.png"))
    assert message == ("refused '127.0.0.2': it resolves to 127.0.0.2, which is loopback, "
                       "not a public address")
    assert other.paths() == []  # nothing ever reached 127.0.0.2
    both = MediaPolicy(allowed_private_networks=("127.0.0.1/32", "127.0.0.2"))
    assert load(other.url("/image.png"), policy=both).mime == "image/png"
    assert other.paths() == ["/image.png"]
    with other.lock:
        other.hits.clear()


def test_every_resolved_address_is_checked(web: Server, dns: FakeDNS) -> None:
    dns.answers["mixed.test"] = [["127.0.0.1", "10.1.2.3"]]
    dns.answers["mixed6.test"] = [["::1", "127.0.0.1"]]
    before = len(web.paths())
    assert "10.1.2.3, which is private" in refused(web.url("/image.png", "mixed.test"))
    assert "::1, which is loopback" in refused(web.url("/image.png", "mixed6.test"))
    assert len(web.paths()) == before


def test_the_checked_address_is_the_one_connected_to(web: Server, other: Server,
                                                     dns: FakeDNS) -> None:
    """DNS rebinding: the name answers 127.0.0.1 (allowed) once, then 127.0.0.2 (refused).
    One lookup, and the request goes to the checked address with the name as Host."""
    dns.answers["rebind.test"] = [["127.0.0.1"], ["127.0.0.2"]]
    assert load(web.url("/image.png", "rebind.test")).mime == "image/png"
    assert dns.calls == ["rebind.test"]
    assert web.hits[-1] == ("/image.png", f"rebind.test:{web.port}")
    assert other.paths() == []


def test_the_next_checked_address_is_tried_when_one_does_not_connect(web: Server,
                                                                     dns: FakeDNS) -> None:
    dns.answers["multi.test"] = [["127.0.0.3", "127.0.0.1"]]  # nothing listens on 127.0.0.3
    policy = MediaPolicy(timeout_seconds=5, allowed_private_networks=("127.0.0.0/30",))
    assert load(web.url("/image.png", "multi.test"), policy=policy).mime == "image/png"
    dns.answers["down.test"] = [["127.0.0.3"]]
    message = refused(web.url("/image.png", "down.test"), policy=policy)
    assert message.startswith("fetching the image from 'down.test' failed:")


def test_unresolvable_host(dns: FakeDNS) -> None:
    dns.answers["nowhere.test"] = [[]]
    assert refused("http://nowhere.test/image.png") == "could not resolve the host 'nowhere.test'"


def test_allowed_domains_are_exact_and_normalised(web: Server, dns: FakeDNS) -> None:
    dns.answers["media.test"] = [["127.0.0.1"]]
    dns.answers["xn--bcher-kva.test"] = [["127.0.0.1"]]
    policy = MediaPolicy(timeout_seconds=5, allowed_private_networks=("127.0.0.1/32",),
                         allowed_domains=("Media.Test.", "bücher.test"))
    assert load(web.url("/image.png", "MEDIA.test."), policy=policy).mime == "image/png"
    assert load(web.url("/image.png", "BÜCHER.test"), policy=policy).mime == "image/png"
    assert web.hits[-1][1] == f"xn--bcher-kva.test:{web.port}"  # IDNA on the wire
    for host in ("127.0.0.1", "sub.media.test", "media.test.evil", "localhost"):
        assert "is not in the allowed domains" in refused(web.url("/image.png", host),
                                                          policy=policy)


# --- http(s): redirects ----------------------------------------------------------------------

def test_redirects_are_followed_up_to_the_limit(web: Server) -> None:
    assert load(web.url("/chain/3")).mime == "image/png"
    assert web.paths()[-4:] == ["/chain/3", "/chain/2", "/chain/1", "/chain/0"]
    assert load(web.url("/relative/page")).mime == "image/png"
    assert web.paths()[-1] == "/image.png"
    strict = MediaPolicy(timeout_seconds=5, allowed_private_networks=("127.0.0.1/32",),
                         max_redirects=2)
    assert refused(web.url("/chain/3"), policy=strict) == "too many redirects (more than 2)"
    assert refused(web.url("/loop")) == "too many redirects (more than 5)"
    assert web.paths()[-6:] == ["/loop"] * 6


def to(web: Server, target: str, status: int = 302) -> str:
    return web.url(f"/to?status={status}&u=" + quote(target, safe=""))


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_to_a_refused_address_is_refused(web: Server, other: Server,
                                                    status: int) -> None:
    message = refused(to(web, other.url("/image.png"), status))
    assert message == ("refused a redirect to '127.0.0.2': it resolves to 127.0.0.2, which is "
                       "loopback, not a public address")
    assert other.paths() == []


def test_a_redirect_to_a_domain_not_allowed_is_refused(web: Server, dns: FakeDNS) -> None:
    dns.answers["media.test"] = [["127.0.0.1"]]
    policy = MediaPolicy(timeout_seconds=5, allowed_private_networks=("127.0.0.1/32",),
                         allowed_domains=("media.test",))
    start = to(web, web.url("/image.png"))  # via 127.0.0.1 ...
    start = start.replace("127.0.0.1", "media.test", 1)  # ... but entered by name
    assert refused(start, policy=policy) == ("redirect target host '127.0.0.1' is not in the "
                                             "allowed domains")
    assert web.paths()[-1].startswith("/to?")


@pytest.mark.parametrize("target,words", [
    ("file:///etc/passwd", "redirect to a 'file' URL is not allowed"),
    ("data:image/png;base64," + base64.b64encode(samples.png()).decode(),
     "redirect to a 'data' URL is not allowed"),
    ("ftp://127.0.0.1/image.png", "redirect to a 'ftp' URL is not allowed"),
    ("http://user:pw@127.0.0.1/image.png", "user name or password"),
    ("http://[::1%25lo]/x", "zone identifiers"),
])
def test_redirects_to_other_schemes_or_bad_urls_are_refused(web: Server, target: str,
                                                            words: str) -> None:
    assert words in refused(to(web, target))


# --- http(s): size and time ------------------------------------------------------------------

@pytest.mark.parametrize("framing", ["length", "close", "chunked"])
def test_an_oversized_body_stops_the_download_early(web: Server, framing: str) -> None:
    key = uuid.uuid4().hex
    policy = MediaPolicy(image_max_bytes=MB, timeout_seconds=10,
                         allowed_private_networks=("127.0.0.1/32",))
    started = time.monotonic()
    message = refused(web.url(f"/huge/{framing}?id={key}"), policy=policy)
    assert time.monotonic() - started < 5
    if framing == "length":  # refused on the header, before any body byte is read
        assert message == (f"image too large: the server declares {HUGE} bytes "
                           f"(the limit is {MB} bytes)")
    else:
        assert message == f"image too large: more than {MB} bytes (the limit is {MB} bytes)"
    assert web.finish(key).wait(10), "the server never noticed the client hang up"
    assert web.sent[key] < HUGE // 4  # the rest was never sent: the connection was dropped


@pytest.mark.parametrize("path", ["/trickle", "/stall"])
def test_the_whole_fetch_is_bounded_by_the_timeout(web: Server, path: str) -> None:
    policy = MediaPolicy(timeout_seconds=1, allowed_private_networks=("127.0.0.1/32",))
    key = uuid.uuid4().hex
    started = time.monotonic()
    message = refused(web.url(f"{path}?id={key}"), policy=policy)
    elapsed = time.monotonic() - started
    assert message == "loading the image timed out after 1 s"
    assert 0.9 < elapsed < 2.0
    if path == "/trickle":
        assert web.finish(key).wait(5)
        assert web.sent[key] < 100  # about 20 bytes in one second


# --- https -----------------------------------------------------------------------------------

def tls_contexts(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A throwaway CA and a certificate for media.test: (server context, client context)."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "llamaserve test CA")])
    usage = {k: False for k in ("digital_signature", "content_commitment", "key_encipherment",
                                "data_encipherment", "key_agreement", "key_cert_sign",
                                "crl_sign", "encipher_only", "decipher_only")}

    def builder(subject: Any, public: Any) -> Any:
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name)
                .public_key(public).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), False))

    ca = (builder(ca_name, ca_key.public_key())
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
          .add_extension(x509.KeyUsage(**{**usage, "key_cert_sign": True, "crl_sign": True}),
                         True)
          .sign(ca_key, hashes.SHA256()))
    leaf = (builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "media.test")]),
                    key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
            .add_extension(x509.KeyUsage(**{**usage, "digital_signature": True}), True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("media.test")]), False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (tmp_path / "cert.pem").write_bytes(leaf.public_bytes(pem))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    client = ssl.create_default_context(cadata=ca.public_bytes(pem).decode())
    return server, client


def test_https_connects_to_the_checked_address_with_the_name_in_sni_and_host(
        tmp_path: Path, dns: FakeDNS, monkeypatch: pytest.MonkeyPatch) -> None:
    server_tls, client_tls = tls_contexts(tmp_path)
    names: list[str | None] = []

    def record_sni(sock: Any, name: str | None, context: Any) -> None:
        names.append(name)

    server_tls.sni_callback = record_sni
    monkeypatch.setattr(media_fetch, "_tls_context", lambda: client_tls)  # trust the test CA
    dns.answers["media.test"] = [["127.0.0.1"]]
    dns.answers["wrong.test"] = [["127.0.0.1"]]
    with serving(Server("127.0.0.1", tls=server_tls)) as server:
        media = load(server.url("/image.png", "media.test"))
        assert media.mime == "image/png"
        assert names == ["media.test"]
        assert server.hits == [("/image.png", f"media.test:{server.port}")]
        # the certificate is checked against the URL's host, not the address
        message = refused(server.url("/image.png", "wrong.test"))
        assert message.startswith("fetching the image from 'wrong.test' failed")
        assert "certificate" in message.lower()
        assert len(server.hits) == 1


# --- URLs ------------------------------------------------------------------------------------

@pytest.mark.parametrize("url,words", [
    ("", "empty URL"),
    ("image.png", "not an absolute URL"),
    (PNG_B64, "inline bytes go in a data: URL, data:<mime>;base64,<data>"),
    ("/etc/passwd", "not an absolute URL"),
    ("//example.com/image.png", "not an absolute URL"),
    ("ftp://example.com/image.png", "unsupported URL scheme 'ftp'"),
    ("gopher://example.com/", "unsupported URL scheme 'gopher'"),
    ("javascript:alert(1)", "unsupported URL scheme 'javascript'"),
    ("C:\\images\\cat.png", "unsupported URL scheme 'c'"),
    ("blob:https://example.com/uuid", "unsupported URL scheme 'blob'"),
    ("http://user:secret@example.com/x.png", "user name or password"),
    ("http://example.com@127.0.0.1/x.png", "user name or password"),
    ("http://example.com\\@127.0.0.1/x.png", "a backslash at character 18"),
    ("http://example.com/a b.png", "a space at character 20"),
    ("http://example.com/\x00.png", "a control character"),
    ("http://example.com/\n.png", "a control character"),
    (" http://example.com/x.png", "not an absolute URL"),
    ("http://exa\ud800mple.com/", "not valid Unicode"),
    ("http://example.com/" + "a" * 9000, "URL too long: 9019 characters (at most 8192)"),
    ("http://example.com:99999/", "bad host or port"),
    ("http://example.com:http/", "bad host or port"),
    ("http://example.com:0/", "invalid port 0"),
    ("http://[::1/x.png", "bad host or port"),
    ("http://[zz::1]/x.png", "bad host or port"),
    ("http://[fe80::1%25eth0]/x.png", "zone identifiers"),
    ("http:///x.png", "has no host"),
    ("http:x.png", "has no host"),
    ("http://ex%61mple.com/x.png", "invalid host name 'ex%61mple.com'"),
    ("http://exa_mple..com/x.png", "invalid host name"),
    ("http://" + "a" * 64 + ".com/", "invalid host name"),
])
def test_bad_urls_are_refused_naming_the_problem(url: str, words: str) -> None:
    message = refused(url, policy=MediaPolicy(allowed_domains=("example.com",)))
    assert words in message
    assert len(message) < 400


# --- data: URLs and base64 -------------------------------------------------------------------

SMALL = MediaPolicy(image_max_bytes=1000, audio_max_bytes=1000)


def padded_png(size: int) -> bytes:
    return samples.png() + bytes(size - len(samples.png()))


@pytest.mark.parametrize("url", [
    "data:image/png;base64," + PNG_B64,
    "DATA:IMAGE/PNG;BASE64," + PNG_B64,
    "data:;base64," + PNG_B64,
    "data:text/plain;charset=utf-8;base64," + PNG_B64,  # the declared type is not used
    "data:image/png;base64," + PNG_B64.rstrip("="),  # padding left out
    "data:image/png;base64," + "\r\n".join(PNG_B64[i:i + 8] for i in range(0, 200, 8)),
    "data:image/png;base64," + PNG_B64.replace("+", "%2B").replace("/", "%2F"),
    "data:image/png," + quote(samples.png()),  # percent-encoded bytes, no base64
])
def test_data_urls(url: str) -> None:
    assert asyncio.run(load_media(url, "image", DEFAULT, PARAM)) == MediaBytes(
        "image", "image/png", samples.png())


@pytest.mark.parametrize("url,words", [
    ("data:image/png;base64,!!!!", "invalid base64"),
    ("data:image/png;base64,AAAAA", "invalid base64"),
    ("data:image/png;base64,AA=A", "invalid base64"),
    ("data:image/png;base64,AAAA\ud800", "invalid base64"),
    ("data:image/png;base64,AAAA%2", "bad percent-encoding in the data: URL at character 4"),
    ("data:image/png,%zz", "bad percent-encoding"),
    ("data:image/png,\udc80", "not valid Unicode"),
    ("data:image/png;base64" + PNG_B64, "no ','"),
    ("data:image/png;base64,", "not an image (empty)"),
    ("data:image/png;base64," + base64.b64encode(HTML).decode(), "not an image (looks like HTML)"),
    ("data:image/png;base64," + base64.b64encode(samples.wav()).decode(),
     "not an image (audio/wav)"),
    ("data:image/webp;base64," + base64.b64encode(samples.webp()).decode(),
     "unsupported image format webp"),
    ("data:image/png;base64," + base64.b64encode(samples.png()[:20]).decode(),
     "not an image (unrecognized data, 20 bytes)"),
])
def test_bad_data_urls(url: str, words: str) -> None:
    assert words in refused(url, policy=DEFAULT)


def test_data_url_size_is_checked_before_and_after_decoding() -> None:
    exact = "data:image/png;base64," + base64.b64encode(padded_png(1000)).decode()
    assert len(load(exact, policy=SMALL).data) == 1000
    over = "data:image/png;base64," + base64.b64encode(padded_png(1001)).decode()
    assert refused(over, policy=SMALL) == "image too large: 1001 bytes (the limit is 1000 bytes)"
    # 100 MB of text that is not even base64: refused on its length alone, without decoding
    huge = "data:image/png;base64," + "!" * (100 * MB)
    started = time.monotonic()
    message = refused(huge, policy=DEFAULT)
    assert time.monotonic() - started < 0.5
    assert message == ("image too large: about 78643200 bytes after decoding "
                       "(the limit is 20971520 bytes)")
    plain = "data:image/png," + "%00" * 999 + "ab"  # 2999 characters for 1001 bytes
    assert refused(plain, policy=SMALL) == "image too large: 1001 bytes (the limit is 1000 bytes)"
    assert refused("data:image/png," + "x" * 3003, policy=SMALL) == (
        "image too large: at least 1001 bytes (the limit is 1000 bytes)")


@pytest.mark.parametrize("data,mime", [
    (samples.wav(), "audio/wav"),
    (samples.mp3(), "audio/mpeg"),
    (samples.mp3(id3=False), "audio/mpeg"),
    (samples.flac(), "audio/flac"),
])
def test_decode_base64_media_audio(data: bytes, mime: str) -> None:
    text = base64.b64encode(data).decode()
    assert decode_base64_media(text, "audio", DEFAULT, "p") == MediaBytes("audio", mime, data)
    assert decode_base64_media(f"data:audio/x;base64,{text}", "audio", DEFAULT,
                               "p").mime == mime


@pytest.mark.parametrize("data,expected,words", [
    (base64.b64encode(samples.mp3()).decode(), "image", "not an image (audio/mpeg)"),
    (base64.b64encode(samples.png()).decode(), "audio", "not audio (image/png)"),
    (base64.b64encode(b"RIFF\x00\x00\x00\x00AVI LIST").decode(), "audio",
     "not audio (unrecognized data"),
    ("UklGR!!!", "audio", "invalid base64"),
    ("", "audio", "not audio (empty)"),
    (b"UklGRg==", "audio", "base64 data must be a string"),
    (None, "audio", "base64 data must be a string"),
    ("A" * 1500, "audio", "audio too large: about 1125 bytes after decoding"),
])
def test_decode_base64_media_refusals(data: Any, expected: Any, words: str) -> None:
    with pytest.raises(MediaError) as err:
        decode_base64_media(data, expected, SMALL, "messages[0].content[0].input_audio.data")
    assert words in err.value.message
    assert err.value.param == "messages[0].content[0].input_audio.data"


@pytest.mark.parametrize("data,kind,words", [
    # a few hundred bytes for gigabytes of pixels: refused from the header, never decoded
    (samples.png_claiming(65535, 65535), "image",
     "image too large: 65535 × 65535 pixels (the limit is 16777216 pixels)"),
    (samples.gif_claiming(65535, 65535), "image", "65535 × 65535 pixels"),
    (samples.bmp_claiming(20000, -20000), "image", "20000 × 20000 pixels"),
    (samples.jpeg_claiming(65535, 65535), "image", "65535 × 65535 pixels"),
    (samples.jpeg_claiming(2048, 2048, scans=1000), "image",
     "corrupt JPEG: 1000 scans (at most 100)"),  # 22 kB: 13 s in stb_image
    (samples.png_bomb(4097, 4096), "image", "4097 × 4096 pixels"),
    (samples.png_claiming(0, 10), "image", "corrupt PNG: the header says 0 × 10 pixels"),
    (b"\xff\xd8\xff\xe0\x00\x10" + bytes(14) + b"\xff\xd9", "image",
     "corrupt JPEG: no JPEG frame header"),
    (samples.flac_claiming(), "audio", "audio too long: about 6.9e+10 s (the limit is 3600 s)"),
    (samples.flac_claiming(rate=16000, total_samples=16000 * 3601), "audio",
     "audio too long: 3601 s"),
    (samples.wav_claiming(rate=1, bits=8, payload=bytes(5000)), "audio", "audio too long: 5000 s"),
    (samples.wav_claiming(channels=0), "audio", "corrupt WAV: the header says 0 channels"),
    # sniffed as MP3, decoded as FLAC (miniaudio's FLAC decoder skips the ID3 tag)
    (samples.ID3_EMPTY + samples.flac_claiming(), "audio", "audio too long: about 6.9e+10 s"),
    # 1 kB of MP3 whose Xing tag claims a million frames: 7 hours, 1.7 GB of samples
    (samples.mp3_xing(1_000_000), "audio", "audio too long: 26122 s"),
    (samples.ID3_EMPTY + b"OggS" + bytes(60), "audio", "corrupt MP3: Ogg after an ID3 tag"),
])
def test_decompression_bombs_are_refused_from_the_header(data: bytes, kind: Any,
                                                         words: str) -> None:
    started = time.monotonic()
    with pytest.raises(MediaError) as err:
        decode_base64_media(base64.b64encode(data).decode(), kind, DEFAULT, "p")
    assert words in err.value.message
    url = f"data:{kind}/x;base64,{base64.b64encode(data).decode()}"
    assert words in refused(url, kind, policy=DEFAULT)
    assert time.monotonic() - started < 0.5


def test_pixel_and_duration_limits_are_the_policy_s() -> None:
    policy = MediaPolicy(image_max_pixels=100, audio_max_seconds=1.0)
    assert load(f"data:;base64,{base64.b64encode(samples.png(10, 10)).decode()}",
                policy=policy).data == samples.png(10, 10)
    assert "11 × 10 pixels (the limit is 100 pixels)" in refused(
        f"data:;base64,{base64.b64encode(samples.png(11, 10)).decode()}", policy=policy)
    assert decode_base64_media(base64.b64encode(samples.wav(1.0)).decode(), "audio", policy,
                               "p").mime == "audio/wav"
    with pytest.raises(MediaError, match="audio too long: 2 s"):
        decode_base64_media(base64.b64encode(samples.wav(2.0)).decode(), "audio", policy, "p")


def test_decode_base64_media_refuses_100_mb_before_decoding(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused from its length alone: the text is never decoded, cleaned or copied (a timing
    bound here failed on a loaded machine; what matters is that no work scales with it)."""
    text = "A" * (100 * MB + 4)

    def never(*args: object, **kwargs: object) -> bytes:
        raise AssertionError("the oversized text was decoded")

    monkeypatch.setattr(media_fetch.base64, "b64decode", never)
    monkeypatch.setattr(media_fetch, "_BASE64_SPACE", None)  # no regex pass over it either
    with pytest.raises(MediaError, match="audio too large"):
        decode_base64_media(text, "audio", MediaPolicy(audio_max_bytes=10 * MB), "p")


# --- file: -----------------------------------------------------------------------------------

@pytest.fixture
def files(tmp_path: Path) -> Path:
    """tmp/media (the root): image.png, "my image.png", sound.wav, notes.txt, big.png, sub/,
    a fifo, symlinks in and out; tmp/secret.png and tmp/media2/image.png outside it."""
    root = tmp_path / "media"
    (root / "sub").mkdir(parents=True)
    (root / "image.png").write_bytes(samples.png())
    (root / "sub" / "deep.png").write_bytes(samples.png())
    (root / "my image #1.png").write_bytes(samples.png())
    (root / "sound.wav").write_bytes(samples.wav())
    (root / "notes.txt").write_text("not an image")
    (root / "big.png").write_bytes(padded_png(1001))
    (tmp_path / "secret.png").write_bytes(samples.png())
    (tmp_path / "media2").mkdir()
    (tmp_path / "media2" / "image.png").write_bytes(samples.png())
    (root / "link-in.png").symlink_to(root / "image.png")
    (root / "link-out.png").symlink_to(tmp_path / "secret.png")
    (root / "link-up").symlink_to(tmp_path)
    (tmp_path / "root-link").symlink_to(root)
    os.mkfifo(root / "fifo.png")
    return root


def policy_for(root: Path | str) -> MediaPolicy:
    return MediaPolicy(allowed_local_path=str(root), image_max_bytes=1000, timeout_seconds=5)


def test_files_inside_the_root(files: Path) -> None:
    policy = policy_for(files)
    for url in (f"file://{files}/image.png", f"file:{files}/image.png",
                f"file://localhost{files}/image.png", f"file://LOCALHOST{files}/sub/deep.png",
                f"file://{files}/sub/../image.png", f"file://{files}/link-in.png",
                f"file://{files}/my%20image%20%231.png", f"file://{files}/link-up/media/image.png"):
        assert load(url, policy=policy) == MediaBytes("image", "image/png", samples.png()), url
    assert load(f"file://{files}/sound.wav", "audio", policy).mime == "audio/wav"
    # a root reached through a symlink works by either name
    link_root = policy_for(files.parent / "root-link")
    assert load(f"file://{files.parent}/root-link/image.png", policy=link_root).data
    assert load(f"file://{files}/image.png", policy=link_root).data


@pytest.mark.parametrize("path,words", [
    ("{tmp}/secret.png", "is outside the directory allowed for file: URLs"),
    ("{root}/../secret.png", "is outside the directory allowed"),
    ("{root}/%2e%2e/secret.png", "is outside the directory allowed"),
    ("{root}/sub/../../secret.png", "is outside the directory allowed"),
    ("{tmp}/media2/image.png", "is outside the directory allowed"),  # a prefix, not inside
    ("{root}/link-out.png", "is outside the directory allowed"),
    ("{root}/link-up/secret.png", "is outside the directory allowed"),
    ("/etc/passwd", "is outside the directory allowed"),
    ("{root}/missing.png", "file not found"),
    ("{root}/sub", "is not a regular file"),
    ("{root}/fifo.png", "is not a regular file"),
    ("{root}/notes.txt", "not an image (looks like text)"),
    ("{root}/big.png", "image too large: 1001 bytes (the limit is 1000 bytes)"),
    ("{root}/image.png%00.txt", "NUL byte"),
    ("{root}/bad%zzname.png", "bad percent-encoding"),
])
def test_files_refused(files: Path, path: str, words: str) -> None:
    url = "file://" + path.format(root=files, tmp=files.parent)
    started = time.monotonic()
    assert words in refused(url, policy=policy_for(files))
    assert time.monotonic() - started < 2  # a fifo is never waited on


@pytest.mark.parametrize("url,words", [
    ("file://fileserver/share/image.png", "naming a host ('fileserver')"),
    ("file://127.0.0.1/{root}/image.png", "naming a host"),
    ("file:image.png", "must be absolute"),
    ("file:///{root}/image.png?x=1", "no query or fragment"),
    ("file:///{root}/image.png#frag", "no query or fragment"),
])
def test_file_urls_of_the_wrong_shape(files: Path, url: str, words: str) -> None:
    assert words in refused(url.format(root=files), policy=policy_for(files))


def test_device_files_and_no_root() -> None:
    assert "is not a regular file" in refused("file:///dev/zero", policy=policy_for("/dev"))
    assert "is not a regular file" in refused("file:///dev/urandom", policy=policy_for("/"))
    assert refused("file:///etc/hostname", policy=DEFAULT) == (
        "file: URLs are not allowed on this server")


# --- policy and address checks ---------------------------------------------------------------

@pytest.mark.parametrize("address,reason", [
    ("8.8.8.8", None),
    ("2606:4700::1111", None),
    ("::ffff:8.8.8.8", None),
    ("2002:808:808::1", None),  # 6to4 of a public address
    ("127.0.0.1", "loopback"),
    ("::1", "loopback"),
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("10.20.30.40", "private"),
    ("192.168.0.1", "private"),
    ("172.31.255.255", "private"),
    ("169.254.169.254", "link-local"),
    ("fe80::1", "link-local"),
    ("fc00::1", "private"),
    ("100.64.0.1", "shared (CGNAT)"),
    ("224.0.0.251", "multicast"),
    ("ff02::1", "multicast"),
    ("240.0.0.1", "reserved"),
    ("192.0.2.1", "private"),  # documentation
    ("::ffff:127.0.0.1", "loopback"),
    ("::ffff:192.168.1.1", "private"),
    ("64:ff9b::7f00:1", "an IPv6 address embedding 127.0.0.1 (loopback)"),
    ("2002:a00:1::", "an IPv6 address embedding 10.0.0.1 (private)"),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "private"),  # Teredo
])
def test_check_address(address: str, reason: str | None) -> None:
    ip = ipaddress.ip_address(address)
    assert check_address(ip, MediaPolicy()) == reason
    assert check_address(ip, MediaPolicy(allow_private_addresses=True)) is None


def test_allowed_private_networks() -> None:
    policy = MediaPolicy(allowed_private_networks=("10.1.0.0/16", "fd00::/8"))
    assert check_address(ipaddress.ip_address("10.1.2.3"), policy) is None
    assert check_address(ipaddress.ip_address("::ffff:10.1.2.3"), policy) is None
    assert check_address(ipaddress.ip_address("fd12::1"), policy) is None
    assert check_address(ipaddress.ip_address("10.2.0.1"), policy) == "private"


@pytest.mark.parametrize("kwargs,words", [
    ({"image_max_bytes": 0}, "size limits"),
    ({"timeout_seconds": 0}, "timeout"),
    ({"timeout_seconds": float("nan")}, "timeout"),
    ({"max_redirects": -1}, "max_redirects"),
    ({"allowed_local_path": ""}, "allowed_local_path"),
    ({"allowed_private_networks": ("10.0.0.0/33",)}, "allowed_private_networks"),
    ({"allowed_domains": ("bad host",)}, "allowed_domains"),
    ({"image_max_pixels": 0}, "image_max_pixels"),
    ({"audio_max_seconds": float("inf")}, "audio_max_seconds"),
])
def test_policy_validation(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        MediaPolicy(**kwargs)


# --- anything in, MediaBytes or MediaError out -----------------------------------------------

CHARS = st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr),
                  st.sampled_from(":/?#[]@%.\\ \t\n\x00"))
PREFIXES = ["", "http://", "https://", "HTTP://localhost", "http://localhost:", "http://[",
            "http://127.0.0.1/", "http://[::1]:", "http://user@", "http://2130706433/",
            "file:", "file://", "file:///", "file://localhost/", "data:", "data:,",
            "data:image/png;base64,", "data:;base64,iVBORw0KGgo", "ftp://", "javascript:", "//"]


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "image.png").write_bytes(samples.png())
    (root / "a").write_bytes(HTML)
    return root


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_any_text_is_media_or_a_media_error(fuzz_root: Path, data: st.DataObject) -> None:
    """No private address allowed and only loopback names on the domain list: whatever the
    text, nothing is looked up in real DNS and nothing connects."""
    url = data.draw(st.one_of(
        st.text(CHARS, max_size=200),
        st.tuples(st.sampled_from(PREFIXES), st.text(CHARS, max_size=200)).map("".join),
        st.text(CHARS, max_size=100).map(lambda t: f"file://{fuzz_root}/{t}"),
        st.tuples(st.sampled_from(PREFIXES), st.sampled_from("A%/.:@[\ud800"),
                  st.integers(0, 300_000)).map(lambda t: t[0] + t[1] * t[2]),
    ))
    expected = data.draw(st.sampled_from(["image", "audio"]))
    policy = MediaPolicy(image_max_bytes=64 * 1024, audio_max_bytes=64 * 1024,
                         timeout_seconds=3, allowed_local_path=str(fuzz_root),
                         allowed_domains=("localhost", "127.0.0.1", "[::1]", "2130706433"))
    started = time.monotonic()
    try:
        media = asyncio.run(load_media(url, expected, policy, PARAM))
    except MediaError as err:
        assert err.param == PARAM and err.message
        err.message.encode()
    else:
        assert media.kind == expected and media.data
    assert time.monotonic() - started < 2


@settings(max_examples=60, deadline=None)
@given(path=st.text(CHARS, max_size=80))
def test_any_path_on_a_real_server_is_media_or_a_media_error(web: Server, path: str) -> None:
    policy = MediaPolicy(timeout_seconds=3, allowed_private_networks=("127.0.0.1/32",))
    try:
        media = asyncio.run(load_media(web.url("/") + path, "image", policy, PARAM))
    except MediaError as err:
        err.message.encode()
    else:
        assert media.mime in ("image/png", "image/jpeg")
