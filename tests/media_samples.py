"""Small, valid media files made with the standard library, for the media sniffing and
loading tests (tests/test_media_sniff.py, tests/test_media_fetch.py)."""

from __future__ import annotations

import io
import struct
import wave
import zlib


def png(width: int = 2, height: int = 2) -> bytes:
    """An RGB PNG (red pixels)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body)))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def jpeg() -> bytes:
    """The start of a JFIF JPEG (SOI, APP0) and its end marker: JPEG to a sniffer."""
    app0 = b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    return b"\xff\xd8\xff\xe0" + struct.pack(">H", len(app0) + 2) + app0 + b"\xff\xd9"


GIF = (b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xf9\x04\x01\x00\x00"
       b"\x00\x00,\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;")


def bmp() -> bytes:
    """A 1×1 24-bit BMP with a BITMAPINFOHEADER."""
    pixels = b"\x00\x00\xff\x00"
    info = struct.pack("<IiiHHIIiiII", 40, 1, 1, 1, 24, 0, len(pixels), 2835, 2835, 0, 0)
    header = struct.pack("<2sIHHI", b"BM", 14 + len(info) + len(pixels), 0, 0, 14 + len(info))
    return header + info + pixels


def webp() -> bytes:
    """A RIFF/WEBP container with a (lossless) VP8L chunk."""
    body = b"WEBP" + b"VP8L" + struct.pack("<I", 10) + b"\x2f\x00\x00\x00\x00" + bytes(5)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def wav(seconds: float = 0.01) -> bytes:
    """16 kHz mono 16-bit PCM silence."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(bytes(2 * int(16000 * seconds)))
    return out.getvalue()


MP3_FRAME = b"\xff\xfb\x90\x64" + bytes(413)  # MPEG-1 layer III, 128 kbit/s, 44.1 kHz


def mp3(id3: bool = True) -> bytes:
    """Two MPEG audio frames, after an empty ID3v2.4 tag when ``id3``."""
    tag = b"ID3\x04\x00\x00\x00\x00\x00\x00" if id3 else b""
    return tag + MP3_FRAME * 2


def flac() -> bytes:
    """The FLAC marker and a (last) STREAMINFO metadata block."""
    return b"fLaC" + b"\x80\x00\x00\x22" + bytes(34)
