"""Images and audio in a request: collected while the messages are parsed, loaded, and
tokenized with the rendered prompt.

While ``parse_messages`` flattens content parts to text, every media part becomes a
marker unique to this request (``MediaRefs.add``), so the chat template places it where
the part was, as text. After rendering, the prompt is split at the markers into text and
media parts for the model's projector (``ModelHandle.tokenize_media``), which wraps each
media in the model's own begin/end tokens. A user cannot forge a marker: each request's
carries a random nonce.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

from api.media.fetch import MediaError as FetchError
from api.media.fetch import MediaPolicy, decode_base64_media, load_media
from api.media.sniff import HeaderError, check_png_stream
from api.web.errors import APIError, invalid
from engine.config import MtmdConfig
from engine.handle import MediaError, MediaInput, MediaPrompt, ModelHandle
from engine.media.spans import is_media_token

AUDIO_FORMATS = ("wav", "mp3", "flac")


def media_policy(cfg: MtmdConfig) -> MediaPolicy:
    return MediaPolicy(image_max_bytes=cfg.image_max_bytes, audio_max_bytes=cfg.audio_max_bytes,
                       timeout_seconds=cfg.image_timeout_seconds,
                       allowed_domains=cfg.allowed_media_domains,
                       allowed_local_path=cfg.allowed_local_media_path,
                       allow_private_addresses=cfg.allow_private_media_addresses,
                       allowed_private_networks=cfg.allowed_private_media_networks,
                       image_max_pixels=cfg.image_max_pixels,
                       audio_max_seconds=cfg.audio_max_seconds)


@dataclass(frozen=True)
class MediaRef:
    kind: str  # "image" | "audio"
    where: str  # the content part, for errors
    url: str | None = None
    data: str | None = None  # base64 (input_audio)


@dataclass
class MediaRefs:
    """The media parts of one request, in the order they were met."""

    limit: int
    nonce: str = field(default_factory=lambda: secrets.token_hex(8))
    refs: list[MediaRef] = field(default_factory=list)

    def marker(self, i: int) -> str:
        return f"<|llamaserve-media-{self.nonce}-{i}|>"

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(rf"<\|llamaserve-media-{self.nonce}-(\d+)\|>")

    def add(self, part: dict[str, Any], where: str) -> str | None:
        """The marker for an image / audio part (None: not a part this handles)."""
        origin = part.get("_where")
        where = origin if isinstance(origin, str) else where
        ref = _ref(part, where)
        if ref is None:
            return None
        if len(self.refs) >= self.limit:
            raise invalid(where, f"at most {self.limit} images or audio clips per request "
                          "(model.mtmd.max_media_per_request)")
        self.refs.append(ref)
        return self.marker(len(self.refs) - 1)


def _url(value: Any, where: str) -> str:
    if isinstance(value, dict):
        value = value.get("url")
    if not isinstance(value, str) or not value:
        raise invalid(where, "the image part needs a 'url' string")
    return value


def _ref(part: dict[str, Any], where: str) -> MediaRef | None:
    kind = part["type"]
    if kind == "image_url":
        return MediaRef("image", f"{where}.image_url.url", url=_url(part.get("image_url"),
                                                                    f"{where}.image_url"))
    if kind == "input_image":
        if part.get("file_id") and not part.get("image_url"):
            raise invalid(f"{where}.file_id", "file ids are not supported; send the image "
                          "as image_url (a data: or http(s): URL)")
        return MediaRef("image", f"{where}.image_url", url=_url(part.get("image_url"),
                                                                f"{where}.image_url"))
    if kind == "input_audio":
        audio = part.get("input_audio")
        if not isinstance(audio, dict) or not isinstance(audio.get("data"), str):
            raise invalid(f"{where}.input_audio", "'input_audio' needs base64 'data'")
        fmt = audio.get("format")
        if fmt is not None and fmt not in AUDIO_FORMATS:
            raise invalid(f"{where}.input_audio.format",
                          f"audio format must be one of {', '.join(AUDIO_FORMATS)}")
        return MediaRef("audio", f"{where}.input_audio.data", data=audio["data"])
    if kind == "audio_url":
        return MediaRef("audio", f"{where}.audio_url.url", url=_url(part.get("audio_url"),
                                                                    f"{where}.audio_url"))
    return None


async def load(refs: MediaRefs, policy: MediaPolicy) -> list[MediaInput]:
    """Every media's bytes (fetched concurrently); the first refusal is a 400 naming its
    content part."""
    async def one(ref: MediaRef) -> MediaInput:
        kind: Literal["image", "audio"] = "image" if ref.kind == "image" else "audio"
        # base64 (bare or a data: URL) is decoded on a worker thread: tens of ms for
        # megabytes, which would stall every other stream on the event loop
        inline = ref.data if ref.url is None else ref.url if ref.url[:5].lower() == "data:" \
            else None
        if inline is not None:
            got = await asyncio.to_thread(decode_base64_media, inline, kind, policy, ref.where)
        else:
            assert ref.url is not None
            got = await load_media(ref.url, kind, policy, ref.where)
        return MediaInput(ref.kind, got.data)

    tasks = [asyncio.ensure_future(one(r)) for r in refs.refs]
    try:
        return list(await asyncio.gather(*tasks))
    except FetchError as exc:
        raise invalid(exc.param, str(exc), code="invalid_media") from None
    finally:
        for t in tasks:
            t.cancel()


def tokenize(model: ModelHandle, refs: MediaRefs, media: list[MediaInput], text: str,
             add_special: bool) -> MediaPrompt:
    """The rendered prompt with its media (prepare pool). A media the template did not
    render is left out; one rendered twice, or a prompt that ends in a media, is a 400; so
    is a PNG whose data inflates past its pixels (checked here, off the event loop)."""
    for ref, item in zip(refs.refs, media, strict=True):
        if item.data.startswith(b"\x89PNG"):  # a sniffed PNG: see check_png_stream
            try:
                check_png_stream(item.data)
            except HeaderError as exc:
                raise invalid(ref.where, f"corrupt PNG: {exc}", code="invalid_media") from None
    parts: list[str | MediaInput] = []
    order: list[int] = []
    at = 0
    for m in refs.pattern.finditer(text):
        i = int(m.group(1))
        if i >= len(media) or i in order:
            raise APIError("the chat template rendered an image or audio part twice",
                           param="messages", code="template_error")
        parts.append(text[at:m.start()])
        parts.append(media[i])
        order.append(i)
        at = m.end()
    parts.append(text[at:])
    try:
        prompt = model.tokenize_media([p for p in parts if p != ""], add_special)
    except MediaError as exc:
        where = refs.refs[order[exc.index]].where if 0 <= exc.index < len(order) else "messages"
        raise invalid(where, str(exc), code="invalid_media") from None
    if prompt.tokens and is_media_token(prompt.tokens[-1]):
        raise invalid("messages", "the prompt cannot end with an image or audio clip")
    return prompt
