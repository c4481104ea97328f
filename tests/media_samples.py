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
    """The start of a JFIF JPEG (SOI, APP0, a 1×1 greyscale frame header) and its end
    marker: JPEG to a sniffer, 1×1 to ``image_size``."""
    app0 = b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof = b"\x08\x00\x01\x00\x01\x01\x01\x11\x00"
    return (b"\xff\xd8\xff\xe0" + struct.pack(">H", len(app0) + 2) + app0
            + b"\xff\xc0" + struct.pack(">H", len(sof) + 2) + sof + b"\xff\xd9")


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
    """The FLAC marker and a (last) STREAMINFO metadata block: 16 kHz mono, 16 bit, an
    unknown length."""
    return flac_claiming(rate=16000, total_samples=0)


# -- valid magic, hostile headers (tests/fuzz_bodies.py, tests/test_media_sniff.py) ----------

def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_claiming(width: int, height: int, idat: bytes = b"garbage") -> bytes:
    """A PNG whose IHDR claims ``width`` × ``height`` (RGB, 8 bit) with ``idat`` as its only
    image data: a few hundred bytes standing for gigabytes of pixels."""
    return (b"\x89PNG\r\n\x1a\n"
            + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b""))


def png_interlaced(width: int, height: int, extra: int = 0) -> bytes:
    """An Adam7-interlaced greyscale PNG of zeros, its zlib data ``extra`` bytes longer than
    its seven passes need."""
    need = 0
    for x0, y0, dx, dy in ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4),
                           (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)):
        cols, rows = (width - x0 + dx - 1) // dx, (height - y0 + dy - 1) // dy
        if cols > 0 and rows > 0:
            need += rows * (1 + cols)
    return (b"\x89PNG\r\n\x1a\n"
            + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 1))
            + _png_chunk(b"IDAT", zeros_zlib(need + extra)) + _png_chunk(b"IEND", b""))


def png_bomb(width: int, height: int) -> bytes:
    """A real decompression bomb: a valid PNG of black pixels whose zlib stream is about
    1/1000 of the pixel bytes (20000 × 20000: 1.2 GB of rows in 1.2 MB)."""
    return png_claiming(width, height, zeros_zlib(height * (1 + 3 * width)))


def zeros_zlib(n: int, chunk: int = 1 << 20) -> bytes:
    """A zlib stream of ``n`` zero bytes, built without compressing them: full-flushed
    deflate blocks of one ``chunk`` each are identical, so one is repeated (the Adler-32 of
    zeros is ``n mod 65521 << 16 | 1``)."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    piece = c.compress(bytes(chunk)) + c.flush(zlib.Z_FULL_FLUSH)
    full, rest = divmod(n, chunk)
    last = zlib.compressobj(9, zlib.DEFLATED, -15)
    tail = last.compress(bytes(rest)) + last.flush()
    return b"\x78\xda" + piece * full + tail + (((n % 65521) << 16) | 1).to_bytes(4, "big")


def gif_claiming(width: int, height: int) -> bytes:
    """A GIF whose logical screen is ``width`` × ``height`` with one 1×1 frame in it."""
    return (b"GIF89a" + struct.pack("<HH", width, height) + b"\x80\x00\x00"
            + b"\x00\x00\x00\xff\xff\xff"  # 2-colour global table
            + b",\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;")


def bmp_claiming(width: int, height: int, bits: int = 24) -> bytes:
    """A BMP (BITMAPINFOHEADER) claiming ``width`` × ``height`` with 4 bytes of pixels."""
    pixels = b"\x00\x00\xff\x00"
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, bits, 0, 0, 2835, 2835, 0, 0)
    header = struct.pack("<2sIHHI", b"BM", 14 + len(info) + len(pixels), 0, 0, 14 + len(info))
    return header + info + pixels


def jpeg_claiming(width: int, height: int, scans: int = 1) -> bytes:
    """A baseline JPEG whose frame header claims ``width`` × ``height`` (3 components), with
    tables and ``scans`` scan headers but hardly any entropy-coded data (a decoder runs
    over every block of the image once per scan)."""
    sof = (b"\x08" + struct.pack(">HH", height, width) + b"\x03"
           + b"\x01\x11\x00\x02\x11\x00\x03\x11\x00")
    dqt = b"\x00" + bytes([1] * 64)
    # one DC and one AC table, each a single 1-bit code
    dht = (b"\x00" + b"\x01" + bytes(15) + b"\x00") + (b"\x10" + b"\x01" + bytes(15) + b"\x00")
    sos = b"\x03" + b"\x01\x00\x02\x00\x03\x00" + b"\x00\x3f\x00"

    def seg(marker: int, body: bytes) -> bytes:
        return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body
    return (b"\xff\xd8" + seg(0xDB, dqt) + seg(0xC0, sof) + seg(0xC4, dht)
            + (seg(0xDA, sos) + bytes(8)) * scans + b"\xff\xd9")


def wav_claiming(*, channels: int = 1, rate: int = 16000, bits: int = 16,
                 data_bytes: int = 0xFFFFFFF0, fmt_tag: int = 1, payload: bytes = bytes(64)
                 ) -> bytes:
    """A RIFF/WAVE whose fmt and data chunk headers say whatever is asked, followed by
    ``payload`` (the data chunk may claim far more)."""
    block = max(channels * bits // 8, 0)
    fmt = struct.pack("<HHIIHH", fmt_tag, channels, rate, (rate * block) & 0xFFFFFFFF,
                      block & 0xFFFF, bits)
    body = (b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
            + b"data" + struct.pack("<I", data_bytes) + payload)
    return b"RIFF" + struct.pack("<I", min(len(body), 0xFFFFFFFF)) + body


def flac_claiming(*, rate: int = 1, channels: int = 1, bits: int = 16,
                  total_samples: int = (1 << 36) - 1) -> bytes:
    """The FLAC marker and a STREAMINFO block claiming ``total_samples`` at ``rate`` Hz, and
    no audio frames."""
    packed = (rate << 44) | ((channels - 1) << 41) | ((bits - 1) << 36) | total_samples
    info = (struct.pack(">HH", 4096, 4096) + bytes(6) + packed.to_bytes(8, "big") + bytes(16))
    return b"fLaC" + b"\x80" + len(info).to_bytes(3, "big") + info


ID3_EMPTY = b"ID3\x04\x00\x00\x00\x00\x00\x00"


def mp3_xing(frames: int, *, header: bytes = b"\xff\xfb\x90\xc4", side: int = 17) -> bytes:
    """An MP3 whose first frame (MPEG-1 layer III, 128 kbit/s, 44.1 kHz, mono by default:
    17 bytes of side info) is a Xing tag claiming ``frames`` frames, then two real ones."""
    body = bytes(side) + b"Xing" + b"\x00\x00\x00\x01" + struct.pack(">I", frames)
    return header + body + bytes(417 - 4 - len(body)) + MP3_FRAME * 2
