"""api/media_sniff.py: media type from magic bytes, never from a name or a declared type;
short or foreign bytes are None, and ``describe`` names them for error messages. Pure."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import media_samples as samples
from api.media_sniff import DECODABLE, describe, sniff


@pytest.mark.parametrize("data,expected", [
    (samples.png(), ("image", "image/png")),
    (samples.jpeg(), ("image", "image/jpeg")),
    (b"\xff\xd8\xff\xdb" + bytes(60), ("image", "image/jpeg")),  # no JFIF/Exif segment
    (samples.GIF, ("image", "image/gif")),
    (b"GIF87a" + bytes(20), ("image", "image/gif")),
    (samples.bmp(), ("image", "image/bmp")),
    (samples.webp(), ("image", "image/webp")),
    (samples.wav(), ("audio", "audio/wav")),
    (samples.mp3(), ("audio", "audio/mpeg")),
    (samples.mp3(id3=False), ("audio", "audio/mpeg")),
    (b"\xff\xf3\x64\xc4" + bytes(100), ("audio", "audio/mpeg")),  # MPEG-2 layer III
    (samples.flac(), ("audio", "audio/flac")),
])
def test_formats_llama_cpp_reads_are_recognized(data: bytes, expected: tuple[str, str]) -> None:
    assert sniff(data) == expected
    assert describe(data) == expected[1]


def test_webp_is_recognized_but_not_decodable() -> None:
    assert "image/webp" not in DECODABLE["image"]
    assert {m for kind in DECODABLE.values() for m in kind} == {
        "image/png", "image/jpeg", "image/gif", "image/bmp",
        "audio/wav", "audio/mpeg", "audio/flac"}


@pytest.mark.parametrize("sample", [samples.png(), samples.jpeg(), samples.GIF, samples.bmp(),
                                    samples.webp(), samples.flac(), samples.mp3()])
def test_truncated_headers_are_not_media(sample: bytes) -> None:
    for cut in range(4):  # the first bytes only: too short to be the format
        assert sniff(sample[:cut]) is None


@pytest.mark.parametrize("data", [
    b"",
    b"\x89PNG\r\n\x1a\n" + bytes(40),  # signature without an IHDR chunk
    b"\xff\xd8\xff",  # JPEG SOI and nothing after
    b"\xff\xd8\xff\x00" + bytes(20),  # not a marker after the SOI
    b"BM" + bytes(40),  # "BM" without a DIB header size stb_image knows
    b"BMW is a car, not a bitmap header at all",
    b"RIFF\x10\x00\x00\x00AVI LIST" + bytes(20),  # RIFF, but AVI
    b"\xff\xf1\x50\x80" + bytes(20),  # AAC ADTS (layer 0): not MP3
    b"\xff\xfb\xf0\x64" + bytes(20),  # MPEG frame with the reserved bitrate index 15
    b"\xff\xfb\x9c\x64" + bytes(20),  # reserved sample rate
    b"\xff\xeb\x90\x64" + bytes(20),  # reserved MPEG version
    b"ID3\x09\x00\x00\x00\x00\x00\x00" + bytes(20),  # no such ID3 version
    b"ID3\x04\x00\x00\x80\x00\x00\x00" + bytes(20),  # size not syncsafe
    b"<!DOCTYPE html><html><body>404</body></html>",
    b"hello world",
    b"\x00" * 64,
])
def test_other_bytes_are_not_media(data: bytes) -> None:
    assert sniff(data) is None


@pytest.mark.parametrize("data,words", [
    (b"", "empty"),
    (b"<!DOCTYPE html><html><head><title>Not Found", "looks like HTML"),
    (b"\n\n  <html lang=en>", "looks like HTML"),
    (b"\xef\xbb\xbf<!doctype HTML>", "looks like HTML"),
    (b'<svg xmlns="http://www.w3.org/2000/svg"/>', "looks like SVG"),
    (b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"/>', "looks like SVG"),
    (b'<?xml version="1.0"?><feed/>', "looks like XML"),
    (b'{"error": "not found"}', "looks like JSON"),
    (b"Access denied.\r\n", "looks like text"),
    ("caf\u00e9 \u00e9t\u00e9".encode() * 100, "looks like text"),  # UTF-8 cut mid-character
    (b"II*\x00" + bytes(20), "looks like TIFF"),
    (b"\x00\x00\x00\x1cftypavif" + bytes(20), "looks like AVIF"),
    (b"\x00\x00\x00\x18ftypheic" + bytes(20), "looks like HEIC"),
    (b"\x00\x00\x00\x18ftypM4A " + bytes(20), "looks like MP4/M4A/MOV"),
    (b"OggS\x00\x02" + bytes(20), "looks like Ogg"),
    (b"%PDF-1.7\n", "looks like PDF"),
    (b"\x1f\x8b\x08\x00" + bytes(20), "looks like gzip"),
    (b"\x00\x01\x02\x03\xfe\xfd", "unrecognized data, 6 bytes"),
])
def test_describe_names_what_the_bytes_look_like(data: bytes, words: str) -> None:
    assert describe(data) == words


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_any_bytes_sniff_to_a_known_answer(data: bytes) -> None:
    found = sniff(data)
    assert found is None or found[1] in (*DECODABLE[found[0]], "image/webp")
    assert isinstance(describe(data), str)
    describe(data).encode()  # never echoes undecodable bytes
