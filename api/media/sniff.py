"""Media type from the bytes themselves (magic numbers), never from a declared MIME type.

``sniff`` knows the formats llama.cpp's multimodal helpers decode — stb_image (PNG, JPEG,
GIF, BMP) and miniaudio (WAV, MP3, FLAC) — plus WEBP, which it reports so that the fetch
layer can refuse it by name (stb_image cannot decode it). ``describe`` names what some
other bytes look like, for error messages.

``image_size`` and ``audio_seconds`` read what the decoders will allocate from the header
alone, so the fetch layer can refuse a bomb before llama.cpp sees it: stb_image allocates
(and for GIF and BMP fills) the width × height the header claims, whatever the file holds;
mtmd sizes its sample buffer from the frame count a FLAC STREAMINFO, an MP3 Xing tag or a
WAV ``fact`` chunk claims, resampled to the projector's rate (a 42-byte FLAC claiming 2^36
samples at 1 Hz made it throw ``std::bad_alloc`` and abort the process), and a WAV at 1 Hz
becomes 16000 times its samples. Pure: no I/O.
"""

from __future__ import annotations

import struct
import zlib
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


# --- what the decoders will allocate, from the header ----------------------------------------

class HeaderError(ValueError):
    """The header of sniffed media is unusable (truncated, zero-sized, contradictory)."""


_JPEG_SOF = frozenset((0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD,
                       0xCE, 0xCF))
_JPEG_STANDALONE = frozenset((0x01, *range(0xD0, 0xD8)))  # TEM, RST0-7: no length
_MAX_SEGMENTS = 4096  # JPEG segments or RIFF chunks walked before giving up
# stb_image runs over every block of the image once per scan: a 345 kB progressive JPEG of
# 2048 x 2048 with 20000 copies of a scan decoded for 64 s (encoders write about 10)
MAX_JPEG_SCANS = 100


def image_size(data: bytes, mime: str) -> tuple[int, int]:
    """``(width, height)`` as the header of a sniffed image claims it (what stb_image
    allocates); ``HeaderError`` when the header does not say."""
    if mime == "image/png":  # sniff saw the IHDR at its place
        width, height = struct.unpack_from(">II", data, 16)
    elif mime == "image/gif":  # the logical screen: stb_image allocates it (4 + 4 + 1 B/px)
        width, height = struct.unpack_from("<HH", data, 6)
    elif mime == "image/bmp":
        if int.from_bytes(data[14:18], "little") == 12:  # OS/2 core header: 16-bit sizes
            width, height = struct.unpack_from("<HH", data, 18)
        else:
            width, signed = struct.unpack_from("<Ii", data, 18)  # negative height: top-down
            height = abs(signed)
    elif mime == "image/jpeg":
        width, height = _jpeg_size(data)
    else:
        raise HeaderError(f"no size for {mime}")
    return int(width), int(height)


_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
          (0, 1, 1, 2))
PNG_SLACK = 1 << 20  # inflated bytes past what the rows need (stb_image tolerates extra)


def check_png_stream(data: bytes) -> None:
    """``HeaderError`` when a sniffed PNG's image data inflates to more than its IHDR's rows
    need: stb_image inflates the whole zlib stream (up to 4 GB) before it looks, so a
    1 MB PNG of 16 x 16 pixels took 954 MB. This inflates (C speed, output discarded, at
    most the rows' size), so it belongs where the decoding runs, not on the event loop.
    A stream zlib cannot read is left for stb_image to refuse."""
    width, height = struct.unpack_from(">II", data, 16)
    depth, color, interlace = data[24], data[25], data[28]
    channels = _PNG_CHANNELS.get(color)
    if channels is None or depth not in (1, 2, 4, 8, 16):
        raise HeaderError(f"colour type {color} at bit depth {depth}")
    passes = _ADAM7 if interlace else ((0, 0, 1, 1),)
    need = 0
    for x0, y0, dx, dy in passes:
        cols, rows = (width - x0 + dx - 1) // dx, (height - y0 + dy - 1) // dy
        if cols > 0 and rows > 0:
            need += rows * (1 + (cols * channels * depth + 7) // 8)
    limit = need + PNG_SLACK
    inflate = zlib.decompressobj()
    total, pos = 0, 8
    try:
        while pos + 8 <= len(data) and not inflate.eof:
            length = int.from_bytes(data[pos:pos + 4], "big")
            kind = data[pos + 4:pos + 8]
            if kind == b"IEND":
                break
            if kind == b"IDAT":
                chunk = data[pos + 8:pos + 8 + length]
                while chunk and not inflate.eof:
                    total += len(inflate.decompress(chunk, limit + 1 - total))
                    if total > limit:
                        raise HeaderError(f"its image data inflates to more than the {need} "
                                          f"bytes {width} × {height} pixels need")
                    chunk = inflate.unconsumed_tail
            pos += 12 + length
    except zlib.error:
        return


def check_image_data(data: bytes, mime: str) -> None:
    """``HeaderError`` when an image of an allowed size would still cost a decoder far more
    than its bytes: a JPEG of more scans than encoders write (stb_image runs over every
    block once per scan), a BMP whose pixels are not there (stb_image reads past the end
    as zeros: 58 bytes claiming 20000 x 20000 pixels decoded for 22 s). Cheap: no
    decoding (PNG data is checked by ``check_png_stream``)."""
    if mime == "image/jpeg":
        scans = data.count(b"\xff\xda")  # SOS: 0xFF in the coded data is stuffed (FF 00)
        if scans > MAX_JPEG_SCANS:
            raise HeaderError(f"{scans} scans (at most {MAX_JPEG_SCANS})")
    elif mime == "image/bmp":
        width, height = image_size(data, mime)
        if int.from_bytes(data[14:18], "little") == 12:
            bits, compression = int.from_bytes(data[24:26], "little"), 0
        elif len(data) >= 34:
            bits, compression = struct.unpack_from("<HI", data, 28)
        else:
            return
        _check_bmp_pixels(data, width, height, bits, compression)


def _check_bmp_pixels(data: bytes, width: int, height: int, bits: int,
                      compression: int) -> None:
    if bits not in (1, 4, 8, 16, 24, 32) or compression not in (0, 3, 6):
        return  # stb_image refuses these itself
    stride = (width * bits + 31) // 32 * 4
    need = stride * (height - 1) + (width * bits + 7) // 8  # the last row's padding may go
    present = len(data) - int.from_bytes(data[10:14], "little")
    if present < need:
        raise HeaderError(f"its {width} × {height} pixels need {need} bytes, "
                          f"{max(present, 0)} are there")


def _jpeg_size(data: bytes) -> tuple[int, int]:
    """The frame header's size, found by walking the segments after SOI the way a decoder
    does (fill bytes skipped, each segment by its length)."""
    pos = 2
    for _ in range(_MAX_SEGMENTS):
        while pos < len(data) and data[pos] == 0xFF and pos + 1 < len(data) \
                and data[pos + 1] == 0xFF:
            pos += 1  # fill bytes before a marker
        if pos + 2 > len(data) or data[pos] != 0xFF:
            break
        marker = data[pos + 1]
        if marker in _JPEG_STANDALONE:
            pos += 2
            continue
        if marker in (0xD8, 0xD9, 0xDA) or pos + 4 > len(data):  # SOI, EOI, scan: no frame
            break
        length = int.from_bytes(data[pos + 2:pos + 4], "big")
        if marker in _JPEG_SOF:
            if length < 8 or pos + 9 > len(data):
                break
            height, width = struct.unpack_from(">HH", data, pos + 5)
            return width, height
        if length < 2:
            break
        pos += 2 + length
    raise HeaderError("no JPEG frame header before the image data")


def audio_seconds(data: bytes, mime: str) -> float | None:
    """How long the audio is, at most, as the decoders will size their buffers; None when
    no header claims a length (the decoder then counts real MP3 frames: the bytes bound it).

    mtmd hands any audio to miniaudio, which tries its WAV, FLAC and MP3 decoders in turn
    whatever the magic said, so every claim counts: a WAV's format, data and ``fact``
    chunks (data cut to the bytes present), a FLAC STREAMINFO after any ID3v2 tags (the
    FLAC decoder skips them: "ID3...fLaC" sniffs as MP3), and an MP3 Xing/Info frame count
    anywhere in the bytes (the MP3 decoder finds its first frame wherever it is; a 1 kB
    file claiming a million frames made mtmd allocate 1.7 GB). ``HeaderError`` for a
    header no decoder can use."""
    claims = [_wav_seconds(data)] if mime == "audio/wav" else []
    start = _id3_end(data)
    if data.startswith(b"fLaC", start):
        claims.append(_flac_seconds(data[start:]))
    elif start and data.startswith(b"OggS", start):
        raise HeaderError("Ogg after an ID3 tag (Ogg FLAC) is not supported")
    xing = _xing_seconds(data)
    if xing is not None:
        claims.append(xing)
    return max(claims) if claims else None


def _id3_end(data: bytes) -> int:
    """Where the bytes after the leading ID3v2 tags start (as miniaudio's FLAC decoder
    skips them: 10-byte header, syncsafe size, 10 more with a footer)."""
    pos = 0
    for _ in range(_MAX_SEGMENTS):
        if data[pos:pos + 3] != b"ID3" or pos + 10 > len(data):
            return pos
        raw = int.from_bytes(data[pos + 6:pos + 10], "big")
        size = ((raw & 0x7F000000) >> 3 | (raw & 0x7F0000) >> 2 | (raw & 0x7F00) >> 1
                | raw & 0x7F)
        pos += 10 + size + (10 if data[pos + 5] & 0x10 else 0)
    raise HeaderError("too many ID3 tags")


_MPEG_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}
_MAX_XING_TAGS = 64


def _xing_seconds(data: bytes) -> float | None:
    """The longest duration any Xing/Info tag with a frame count claims. Its frame's header
    sits just before it (4 bytes, the CRC, the layer III side info: 9, 17 or 32 bytes) and
    gives samples a frame and the rate; a tag without such a header counts at the worst
    rate, 1152 samples at 8 kHz."""
    longest: float | None = None
    seen = 0
    for tag in (b"Xing", b"Info"):
        pos = data.find(tag)
        while pos >= 0:
            seen += 1
            if seen > _MAX_XING_TAGS:
                raise HeaderError("too many Xing/Info tags")
            if pos + 12 <= len(data) and data[pos + 7] & 1:
                frames = int.from_bytes(data[pos + 8:pos + 12], "big")
                seconds = frames * _frame_seconds(data, pos)
                longest = seconds if longest is None else max(longest, seconds)
            pos = data.find(tag, pos + 1)
    return longest


def _frame_seconds(data: bytes, tag: int) -> float:
    for side in (9, 17, 32):
        for crc in (0, 2):
            at = tag - 4 - crc - side
            head = data[at:at + 4] if at >= 0 else b""
            if not _mpeg_frame(head):
                continue
            version, layer = (head[1] >> 3) & 3, (head[1] >> 1) & 3
            mono = head[3] >> 6 == 3
            expect = (17 if mono else 32) if version == 3 else (9 if mono else 17)
            if expect != side or (0 if head[1] & 1 else 2) != crc:
                continue
            samples = 576 if layer == 1 and version != 3 else 1152  # layer III, MPEG-2/2.5
            return samples / _MPEG_RATES[version][(head[2] >> 2) & 3]
    return 1152 / 8000


def _wav_seconds(data: bytes) -> float:
    big = data.startswith(b"RIFX")
    order = ">" if big else "<"
    fmt: tuple[int, int, int, int, int] | None = None
    data_bytes: int | None = None
    fact = 0
    pos = 12
    for _ in range(_MAX_SEGMENTS):
        if pos + 8 > len(data):
            break
        kind = data[pos:pos + 4]
        (size,) = struct.unpack_from(order + "I", data, pos + 4)
        body = pos + 8
        if kind == b"fmt " and fmt is None:
            if size < 16 or body + 16 > len(data):
                raise HeaderError("truncated WAV format chunk")
            tag, channels, rate, block_align, bits = struct.unpack_from(
                order + "HHIxxxxHH", data, body)
            if tag == 0xFFFE and size >= 40 and body + 26 <= len(data):  # extensible:
                (tag,) = struct.unpack_from(order + "H", data, body + 24)  # the subformat
            fmt = tag, channels, rate, block_align, bits
        elif kind == b"fact" and body + 4 <= len(data):  # ADPCM: the sample count
            (fact,) = struct.unpack_from(order + "I", data, body)
        elif kind == b"data" and data_bytes is None:
            data_bytes = min(size, len(data) - body)  # RF64 says 0xFFFFFFFF here
        pos = body + size + (size & 1)
    if fmt is None:
        raise HeaderError("no WAV format chunk")
    tag, channels, rate, block_align, bits = fmt
    if channels == 0 or rate == 0:
        raise HeaderError(f"the header says {channels} channel{'' if channels == 1 else 's'} "
                          f"at {rate} Hz")
    data_bytes = data_bytes or 0
    if tag in (2, 0x11):  # MS / IMA ADPCM: 4-bit samples, plus one a block for IMA
        frames = data_bytes * 3 // channels + 1
    else:  # as miniaudio sizes a frame: whole bytes a sample, else the block alignment
        per_frame = bits * channels // 8 if bits % 8 == 0 else block_align
        if per_frame == 0:
            raise HeaderError(f"the header says {bits} bits a sample")
        frames = data_bytes // per_frame
    return max(frames, fact) / rate


def _flac_seconds(data: bytes) -> float:
    if len(data) < 8 + 18 or data[4] & 0x7F != 0:
        raise HeaderError("the FLAC stream does not start with its STREAMINFO block")
    packed = int.from_bytes(data[18:26], "big")
    rate, total = packed >> 44, packed & ((1 << 36) - 1)
    if rate == 0:
        raise HeaderError("the header says 0 Hz")
    return total / rate  # 0 samples: unknown, and the decoder then reads none
