"""``encrypted_content`` for Responses reasoning items: reasoning that survives a
stateless (``store: false``) tool loop without a server-side store.

The client asks for it with ``include: ["reasoning.encrypted_content"]``, keeps the
opaque string and sends the reasoning item back on its next turn; the server opens
it and the reasoning is part of the prompt again. A token is the reasoning text,
compressed and encrypted with a keystream of HMAC-SHA256(key, nonce ‖ counter), then
authenticated with HMAC-SHA256 over the model alias, the nonce and the ciphertext
(encrypt-then-MAC, standard library only). A token made by another key or for
another model, or changed in any byte, does not open and is ignored.

The key is ``server.reasoning_key`` (or ``$LLAMASERVE_REASONING_KEY``); without one
a random key is made at start, so tokens do not outlive the process. Replicas that
share conversations need the same key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import zlib

VERSION = b"\x01"
NONCE = 16
TAG = 32
MAX_TEXT = 1 << 20  # a reasoning text this long or longer is not sealed


class ReasoningSeal:
    def __init__(self, key: bytes | str | None, model: str) -> None:
        if isinstance(key, str):
            key = key.encode()
        self.key = hashlib.sha256(key).digest() if key else secrets.token_bytes(32)
        self.model = model.encode()

    def _stream(self, nonce: bytes, n: int) -> bytes:
        out = bytearray()
        counter = 0
        while len(out) < n:
            out += hmac.digest(self.key, b"ks" + nonce + counter.to_bytes(8, "big"), "sha256")
            counter += 1
        return bytes(out[:n])

    def _tag(self, nonce: bytes, body: bytes) -> bytes:
        return hmac.digest(self.key, b"tag" + VERSION + self.model + b"\0" + nonce + body,
                           "sha256")

    def seal(self, text: str) -> str:
        plain = zlib.compress(text.encode()[:MAX_TEXT])
        nonce = secrets.token_bytes(NONCE)
        body = bytes(a ^ b for a, b in zip(plain, self._stream(nonce, len(plain)),
                                           strict=True))
        return base64.urlsafe_b64encode(VERSION + nonce + body + self._tag(nonce, body)
                                        ).decode()

    def open(self, token: object) -> str | None:
        """The reasoning text, or None for anything that is not a valid token of ours."""
        if not isinstance(token, str) or len(token) > 4 * MAX_TEXT:
            return None
        try:
            raw = base64.urlsafe_b64decode(token.encode())
        except ValueError:
            return None
        if len(raw) < 1 + NONCE + TAG or raw[:1] != VERSION:
            return None
        nonce, body, tag = raw[1:1 + NONCE], raw[1 + NONCE:-TAG], raw[-TAG:]
        if not hmac.compare_digest(tag, self._tag(nonce, body)):
            return None
        plain = bytes(a ^ b for a, b in zip(body, self._stream(nonce, len(body)), strict=True))
        try:
            return zlib.decompress(plain, bufsize=1 << 16).decode("utf-8", "replace")
        except zlib.error:
            return None
