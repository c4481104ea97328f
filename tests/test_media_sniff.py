"""api/media/sniff.py: media type from magic bytes, never from a name or a declared type;
short or foreign bytes are None, and ``describe`` names them for error messages; the sizes
the decoders will allocate are read from the header alone (bombs included). Pure."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import media_samples as samples
from api.media.sniff import (
    DECODABLE,
    MAX_JPEG_SCANS,
    PNG_SLACK,
    HeaderError,
    audio_seconds,
    check_image_data,
    check_png_stream,
    describe,
    image_size,
    sniff,
)


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


# --- sizes from the header -------------------------------------------------------------------

@pytest.mark.parametrize("data,size", [
    (samples.png(), (2, 2)),
    (samples.png(7, 3), (7, 3)),
    (samples.GIF, (1, 1)),
    (samples.bmp(), (1, 1)),
    (samples.jpeg(), (1, 1)),
    (samples.png_claiming(65535, 65535), (65535, 65535)),
    (samples.png_claiming(2**32 - 1, 1), (2**32 - 1, 1)),
    (samples.gif_claiming(65535, 65535), (65535, 65535)),  # the logical screen, not the frame
    (samples.bmp_claiming(30000, 30000), (30000, 30000)),
    (samples.bmp_claiming(40, -2**31), (40, 2**31)),  # top-down
    (samples.bmp_claiming(-1, 1), (2**32 - 1, 1)),  # stb_image reads the width unsigned
    (samples.jpeg_claiming(65535, 65535), (65535, 65535)),
    (samples.jpeg_claiming(0, 0), (0, 0)),
    (samples.jpeg_claiming(64, 48, scans=MAX_JPEG_SCANS), (64, 48)),
    # fill bytes before a marker, restart markers without a length
    (samples.jpeg()[:20] + b"\xff\xff\xd0\xff\xff" + samples.jpeg()[20:], (1, 1)),
])
def test_image_size_is_what_the_header_claims(data: bytes, size: tuple[int, int]) -> None:
    found = sniff(data)
    assert found is not None and found[0] == "image"
    assert image_size(data, found[1]) == size


@pytest.mark.parametrize("data", [
    b"\xff\xd8\xff\xe0\x00\x10" + bytes(14) + b"\xff\xd9",  # no frame header
    b"\xff\xd8\xff\xda\x00\x08" + bytes(6) + b"\xff\xc0\x00\x11" + bytes(15),  # SOS first
    b"\xff\xd8\xff\xc0\x00\x11\x08",  # truncated frame header
    b"\xff\xd8\xff\xe1\x00\x01" + bytes(20),  # a length below 2
    b"\xff\xd8" + b"\xff\xfe\x00\x02" * 100_000 + samples.jpeg()[2:],  # SOF past 4096 segments
])
def test_jpeg_without_a_readable_frame_header(data: bytes) -> None:
    assert sniff(data) == ("image", "image/jpeg")
    with pytest.raises(HeaderError, match="no JPEG frame header"):
        image_size(data, "image/jpeg")


@pytest.mark.parametrize("data", [
    samples.png(), samples.GIF, samples.bmp(), samples.jpeg(),
    samples.jpeg_claiming(64, 48, scans=MAX_JPEG_SCANS),
    samples.bmp()[:-1],  # the last row's padding may be missing
    samples.bmp_claiming(7, 7, bits=0),  # stb_image refuses it itself
])
def test_image_data_a_decoder_can_afford(data: bytes) -> None:
    found = sniff(data)
    assert found is not None
    check_image_data(data, found[1])


@pytest.mark.parametrize("data,words", [
    # stb_image decodes every block once per scan: 1000 scans of 2048 x 2048 took 13 s
    (samples.jpeg_claiming(64, 48, scans=MAX_JPEG_SCANS + 1),
     f"101 scans \\(at most {MAX_JPEG_SCANS}\\)"),
    # and reads a BMP's missing pixels as zeros: 20000 x 20000 of them took 22 s
    (samples.bmp_claiming(2048, -2048), "2048 × 2048 pixels need 12582912 bytes, 4 are there"),
    (samples.bmp_claiming(100, 100, bits=1), "need 1597 bytes, 4 are there"),
    (samples.bmp()[:54] + b"\x00", "need 3 bytes, 1 are there"),
])
def test_image_data_that_costs_far_more_than_its_bytes(data: bytes, words: str) -> None:
    found = sniff(data)
    assert found is not None
    with pytest.raises(HeaderError, match=words):
        check_image_data(data, found[1])


@pytest.mark.parametrize("data", [
    samples.png(), samples.png(300, 200), samples.png_bomb(512, 512),
    samples.png_interlaced(37, 23), samples.png_interlaced(1, 1),
    samples.png_interlaced(37, 23, extra=PNG_SLACK),  # a little more is tolerated
    samples.png_claiming(16, 16, b"not zlib"),  # stb_image refuses it itself
    samples.png()[:40],  # cut inside the data
])
def test_png_streams_that_inflate_to_their_rows(data: bytes) -> None:
    check_png_stream(data)


@pytest.mark.parametrize("data,need", [
    # 1 MB of PNG claiming 16 x 16 pixels: stb_image inflated all of it (954 MB)
    (samples.png_claiming(16, 16, samples.zeros_zlib(1_000_000_000)), 16 * (1 + 48)),
    (samples.png_interlaced(37, 23, extra=PNG_SLACK + 1), 895),
    (samples.png_bomb(512, 512)[:33] + samples.png_bomb(2048, 2048)[33:], 512 * (1 + 1536)),
])
def test_png_streams_that_inflate_past_their_rows(data: bytes, need: int) -> None:
    started = time.monotonic()
    with pytest.raises(HeaderError, match=f"more than the {need} bytes"):
        check_png_stream(data)
    assert time.monotonic() - started < 0.5  # stops reading at the limit


@pytest.mark.parametrize("data,seconds", [
    (samples.wav(0.01), 0.01),
    (samples.wav(2.0), 2.0),
    # the data chunk claims 4 GB: the decoder reads the 64 bytes that are there
    (samples.wav_claiming(), 32 / 16000),
    (samples.wav_claiming(rate=1, bits=8), 64.0),  # 64 samples at 1 Hz: 16000x at 16 kHz
    (samples.wav_claiming(rate=8000, bits=8, channels=2, payload=bytes(16000)), 1.0),
    # ADPCM: at most 3 samples a byte (IMA adds one a block); a fact chunk's count
    (samples.wav_claiming(fmt_tag=2, bits=4, rate=1000, payload=bytes(1000)), 3.001),
    (samples.wav_claiming(fmt_tag=2, bits=4, rate=10, payload=b"", data_bytes=0)[:-8]
     + b"fact\x04\x00\x00\x00\x40\x42\x0f\x00" + b"data\x00\x00\x00\x00", 100_000.0),
    # frames are sized from the bits, as miniaudio does, not from a block alignment of 0
    (samples.wav_claiming(rate=1, bits=16, payload=bytes(64))[:32] + b"\x00\x00"
     + samples.wav_claiming(rate=1, bits=16, payload=bytes(64))[34:], 32.0),
    (samples.wav_claiming(data_bytes=0, payload=b""), 0.0),
    (samples.flac_claiming(), float(2**36 - 1)),
    (samples.flac_claiming(rate=16000, total_samples=16000 * 90), 90.0),
    (samples.flac(), 0.0),  # length unknown: the decoder reads no frames
    (samples.mp3(), None),  # miniaudio counts the real frames
    # the FLAC decoder skips ID3 tags: this sniffs as MP3 and decodes as FLAC
    (samples.ID3_EMPTY + samples.flac_claiming(), float(2**36 - 1)),
    (b"ID3\x03\x00\x10\x00\x00\x00\x02" + bytes(12) + samples.flac_claiming(rate=16000,
     total_samples=32000), 2.0),  # a 2-byte tag with a 10-byte footer
    # a Xing tag's frame count, at its frame's rate: 1152 samples at 44.1 kHz
    (samples.mp3_xing(1_000_000), 1_000_000 * 1152 / 44100),
    (samples.mp3_xing(100, header=b"\xff\xf3\x90\xc4", side=9), 100 * 576 / 22050),
    (samples.mp3_xing(1000, side=12), 1000 * 1152 / 8000),  # no header before it: worst rate
    (samples.ID3_EMPTY + samples.mp3_xing(10), 10 * 1152 / 44100),
])
def test_audio_seconds_as_the_decoder_will_size_it(data: bytes, seconds: float | None) -> None:
    found = sniff(data)
    assert found is not None and found[0] == "audio"
    assert audio_seconds(data, found[1]) == (None if seconds is None else pytest.approx(seconds))


@pytest.mark.parametrize("data,words", [
    (samples.wav_claiming(channels=0), "0 channels"),
    (samples.wav_claiming(rate=0), "0 Hz"),
    (b"RIFF\x04\x00\x00\x00WAVE", "no WAV format chunk"),
    (b"RIFF\x20\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00", "truncated WAV format"),
    (b"RIFF\x20\x00\x00\x00WAVELIST\xff\xff\xff\xff" + bytes(40), "no WAV format chunk"),
    (b"fLaC\x80\x00\x00\x22" + bytes(34), "0 Hz"),
    (b"fLaC\x84\x00\x00\x22" + bytes(34), "STREAMINFO"),
    (b"fLaC\x80\x00\x00\x22" + bytes(10), "STREAMINFO"),  # cut short
    (samples.wav_claiming(bits=0), "0 bits a sample"),
    (samples.ID3_EMPTY + b"OggS" + bytes(40), "Ogg"),
    (samples.ID3_EMPTY * 5000, "too many ID3 tags"),
    (samples.mp3() + b"Info" * 65, "too many Xing/Info tags"),
])
def test_audio_headers_no_decoder_can_use(data: bytes, words: str) -> None:
    found = sniff(data)
    assert found is not None
    with pytest.raises(HeaderError, match=words):
        audio_seconds(data, found[1])


HEADS = [samples.png(), samples.GIF, samples.bmp(), samples.jpeg(), samples.wav(),
         samples.flac(), samples.mp3(), samples.jpeg_claiming(9, 9), samples.wav_claiming(),
         samples.mp3_xing(5), samples.ID3_EMPTY + samples.flac_claiming()]


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(HEADS), st.integers(0, 80), st.binary(max_size=80), st.booleans())
def test_any_damaged_header_is_a_size_or_a_header_error(head: bytes, at: int, junk: bytes,
                                                        cut: bool) -> None:
    data = head[:at] + junk + (b"" if cut else head[at + len(junk):])
    found = sniff(data)
    if found is None or found[1] == "image/webp":
        return
    try:
        if found[0] == "image":
            width, height = image_size(data, found[1])
            assert width >= 0 and height >= 0
        else:
            seconds = audio_seconds(data, found[1])
            assert seconds is None or seconds >= 0
    except HeaderError:
        pass
