"""A response body's ``Content-Encoding`` undone within the output limit.

httpx decodes each network chunk in one call with no bound on what it produces: a body of a
few KB sent as ``gzip, gzip`` became 4 GiB in one call (8 GB of RSS, and the event loop held
for 17 s past the round's deadline) before the size limit was looked at once. Here the raw
bytes are decoded by ``zlib`` with ``max_length``: no call produces more than what the limit
still has room for, so a bomb costs at most the limit in memory and in time.

Viano never asks for an encoding (no ``Accept-Encoding``), so it takes only what a server
may send anyway: ``identity``, ``gzip`` (``x-gzip``) and ``deflate`` (zlib-wrapped or raw,
as servers send both), one layer. Stacked or other encodings (``br``, ``zstd``) are refused.
"""

from __future__ import annotations

import zlib


class EncodingRefused(Exception):
    """The body's encoding is not one we take, or its compressed data is corrupt; ``detail``
    is the stable code for the audit record."""

    def __init__(self, detail: str, message: str):
        super().__init__(message)
        self.detail = detail


class BodyDecoder:
    def __init__(self, content_encoding: str | None):
        codings = [c.strip().lower() for c in (content_encoding or "").split(",")]
        codings = [c for c in codings if c and c != "identity"]
        if len(codings) > 1:
            raise EncodingRefused("unsupported_content_encoding",
                                  f"the response is encoded {len(codings)} times over "
                                  f"({', '.join(codings)[:100]}): one layer is the most taken")
        self._coding = codings[0] if codings else None
        if self._coding not in (None, "gzip", "x-gzip", "deflate"):
            raise EncodingRefused("unsupported_content_encoding",
                                  f"the response is encoded {self._coding[:40]!r}, which was "
                                  "not asked for (identity, gzip and deflate are taken)")
        self._z: zlib._Decompress | None = None
        if self._coding in ("gzip", "x-gzip"):
            self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._first = True

    def decode(self, data: bytes, room: int) -> bytes:
        """What ``data`` decodes to, at most ``room`` bytes of it (more would be past the
        limit: the caller then abandons the body, so the rest is never decoded)."""
        if self._coding is None or not data:
            return data[:room]
        if self._z is None:  # deflate: zlib-wrapped, or raw as some servers send it
            self._z = zlib.decompressobj(zlib.MAX_WBITS if _zlib_header(data)
                                         else -zlib.MAX_WBITS)
        try:
            out = self._z.decompress(data, max(room, 1))
        except zlib.error as exc:
            raise EncodingRefused("bad_content_encoding",
                                  f"the response's {self._coding} data is corrupt ({exc})"
                                  ) from exc
        return out

    def finish(self) -> None:
        """At the end of the body: compressed data cut short is refused."""
        if self._z is not None and not self._z.eof:
            raise EncodingRefused("bad_content_encoding",
                                  f"the response's {self._coding} data ends before its end")


def _zlib_header(data: bytes) -> bool:
    return len(data) >= 2 and (data[0] & 0x0F) == 8 and ((data[0] << 8) | data[1]) % 31 == 0
