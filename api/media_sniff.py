"""Media type from the bytes themselves (magic numbers), never from a declared MIME type.

``sniff`` knows the formats llama.cpp's multimodal helpers decode — stb_image (PNG, JPEG,
GIF, BMP) and miniaudio (WAV, MP3, FLAC) — plus WEBP, which it reports so that the fetch
layer can refuse it by name (stb_image cannot decode it). ``describe`` names what some
other bytes look like, for error messages. Pure: no I/O.
"""

from __future__ import annotations

from typing import Literal

MediaKind = Literal["image", "audio"]

# what llama.cpp decodes, by kind (the fetch layer accepts exactly these)
DECODABLE: dict[MediaKind, tuple[str, ...]] = {
    "image": ("image/png", "image/jpeg", "image/gif", "image/bmp"),
    "audio": ("audio/wav", "audio/mpeg", "audio/flac"),
}

_PNG = b"\x89PNG\r\n\x1a\n"
_BMP_HEADER_SIZES = (12, 40, 56, 108, 124)  # the DIB headers stb_image reads


def sniff(data: bytes) -> tuple[MediaKind, str] | None:
    """``(kind, mime)`` from the magic bytes, e.g. ``("image", "image/png")``; None when the
    bytes are none of PNG, JPEG, GIF, BMP, WEBP, WAV, MP3 or FLAC (or too short to be one)."""
    image = _sniff_image(data)
    if image is not None:
        return "image", image
    audio = _sniff_audio(data)
    if audio is not None:
        return "audio", audio
    return None


def _sniff_image(data: bytes) -> str | None:
    if data.startswith(_PNG) and len(data) >= 33 and data[12:16] == b"IHDR":
        return "image/png"
    if data.startswith(b"\xff\xd8\xff") and len(data) >= 4 and 0xC0 <= data[3] <= 0xFE:
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 13:
        return "image/gif"
    if (data.startswith(b"BM") and len(data) >= 26
            and int.from_bytes(data[14:18], "little") in _BMP_HEADER_SIZES):
        return "image/bmp"
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP" and len(data) >= 16:
        return "image/webp"
    return None


def _sniff_audio(data: bytes) -> str | None:
    if data[:4] in (b"RIFF", b"RIFX", b"RF64") and data[8:12] == b"WAVE":
        return "audio/wav"
    if data.startswith(b"fLaC") and len(data) >= 8:
        return "audio/flac"
    if _id3_tag(data) or _mpeg_frame(data):
        return "audio/mpeg"
    return None


def _id3_tag(data: bytes) -> bool:
    """An ID3v2 header: "ID3", version 2–4, a revision, flags and a 28-bit syncsafe size."""
    return (len(data) >= 10 and data.startswith(b"ID3") and data[3] in (2, 3, 4)
            and data[4] != 0xFF and all(b < 0x80 for b in data[6:10]))


def _mpeg_frame(data: bytes) -> bool:
    """An MPEG audio frame header: 11 sync bits, then no reserved version, layer, bitrate or
    sample rate (which also keeps AAC's ADTS headers, layer 0, out)."""
    if len(data) < 4 or data[0] != 0xFF or data[1] & 0xE0 != 0xE0:
        return False
    version, layer = (data[1] >> 3) & 3, (data[1] >> 1) & 3
    bitrate, rate = data[2] >> 4, (data[2] >> 2) & 3
    return version != 1 and layer != 0 and bitrate != 0xF and rate != 3


# formats people send that llama.cpp cannot read: (prefix, offset, name)
_OTHER: tuple[tuple[bytes, int, str], ...] = (
    (b"II*\x00", 0, "TIFF"), (b"MM\x00*", 0, "TIFF"), (b"\x00\x00\x01\x00", 0, "ICO"),
    (b"ftypavif", 4, "AVIF"), (b"ftypheic", 4, "HEIC"), (b"ftypmif1", 4, "HEIF"),
    (b"ftyp", 4, "MP4/M4A/MOV"), (b"\x1aE\xdf\xa3", 0, "Matroska/WebM"),
    (b"OggS", 0, "Ogg"), (b"%PDF", 0, "PDF"), (b"PK\x03\x04", 0, "ZIP"),
    (b"\x1f\x8b", 0, "gzip"), (b"\xff\xf1", 0, "AAC"), (b"\xff\xf9", 0, "AAC"),
    (b"\x00\x00\x00\x0cjP  ", 0, "JPEG 2000"), (b"\xff\x0a", 0, "JPEG XL"),
    (b"8BPS", 0, "Photoshop"), (b"qoif", 0, "QOI"),
)


def describe(data: bytes) -> str:
    """A few words on what the bytes look like: the sniffed MIME type, a known format llama.cpp
    cannot read, HTML, SVG, JSON, text, or "unrecognized data". Never echoes the bytes."""
    if not data:
        return "empty"
    found = sniff(data)
    if found is not None:
        return found[1]
    for prefix, offset, name in _OTHER:
        if data[offset:offset + len(prefix)] == prefix:
            return f"looks like {name}"
    head = data[:512].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if head.startswith((b"<!doctype html", b"<html", b"<head", b"<body")):
        return "looks like HTML"
    if head.startswith(b"<svg") or (head.startswith(b"<?xml") and b"<svg" in head):
        return "looks like SVG"
    if head.startswith(b"<?xml"):
        return "looks like XML"
    if head[:1] in (b"{", b"["):
        return "looks like JSON"
    try:
        text = data[:512].decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < 508:  # not just a character cut at the end of the window
            return f"unrecognized data, {len(data)} bytes"
        text = data[:exc.start].decode("utf-8")
    if all(c.isprintable() or c in "\t\r\n" for c in text):
        return "looks like text"
    return f"unrecognized data, {len(data)} bytes"
