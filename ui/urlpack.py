"""An uploaded config.json in a link: compressed and base64url-encoded, so it stays short.

A real config.json of 1-3 KB becomes a few hundred URL-safe characters instead of its
percent-encoded JSON (every `"`, `{`, `:` and `,` takes three characters in a query string).
A link is a request line to whatever proxy stands in front of the app, and nginx refuses one
longer than its `large_client_header_buffers` (8 KB by default) with 414: a link's query
string stays under `MAX_QUERY_CHARS`, and one that would be longer leaves the uploaded
config out (`ui.params.short_link`; the page says so). The shorter of two codecs is used, named by
the first character: `z` zlib (small configs), `x` LZMA (large, repetitive ones). Text starting
with `{` is the plain JSON older links carried. Unpacking is capped: a short link cannot
inflate into more than `max_bytes` (a decompression bomb is refused, not expanded).
"""

from __future__ import annotations

import base64
import binascii
import lzma
import zlib

_LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]

#: The longest query string a link of the app carries: under nginx's default 8 KB request
#: line with room for the method, a base URL path and the protocol. The shipped proxy
#: (deploy/nginx/vram.conf) allows 16 KB; tests/app/test_link_length.py sends the longest
#: link through it.
MAX_QUERY_CHARS = 7_500


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def pack(text: str) -> str:
    """`text` (JSON) as `z`/`x` + base64url of its zlib/LZMA compression, the shorter one."""
    if not text:
        return ""
    raw = text.encode("utf-8")
    packed_zlib = "z" + _b64(zlib.compress(raw, 9))
    packed_lzma = "x" + _b64(lzma.compress(raw, format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS))
    return min(packed_zlib, packed_lzma, key=len)


def _inflater(kind: str) -> zlib._Decompress | lzma.LZMADecompressor:
    if kind == "z":
        return zlib.decompressobj()
    return lzma.LZMADecompressor(format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)


def unpack(text: str, max_bytes: int) -> str:
    """The JSON text of a packed (or plain) link value; ValueError says what is wrong."""
    if text[:1] not in ("z", "x"):
        return text
    body = text[1:]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        inflater = _inflater(text[0])
        data = inflater.decompress(raw, max_bytes + 1)
    except (binascii.Error, ValueError, zlib.error, lzma.LZMAError):
        raise ValueError("not a packed config (base64url of compressed JSON)") from None
    if len(data) > max_bytes:
        raise ValueError(f"unpacks to more than {max_bytes:,} bytes")
    if not inflater.eof:  # under the cap, so every input byte was used: the data is cut short
        raise ValueError("the packed config is cut short")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the packed config is not UTF-8 text") from None
