"""The canonical case catalogue: stable source ids S1, S2, … in the contracted order.

Order: report body, comments, observations (in report order), then attachments in
command-line order, each archive's members by path compared as UTF-8 bytes. The catalogue
is computed once, at intake, and stored; ids are never reused or renumbered.
"""

from __future__ import annotations

import mimetypes
from typing import Any

_TYPES = mimetypes.MimeTypes()  # built-in table only: the same answer on every machine
_EXTRA = {".log": "text/plain", ".txt": "text/plain", ".md": "text/markdown",
          ".lua": "text/x-lua", ".toc": "text/plain", ".ini": "text/plain",
          ".cfg": "text/plain", ".conf": "text/plain", ".toml": "application/toml",
          ".yaml": "application/yaml", ".yml": "application/yaml", ".py": "text/x-python",
          ".dmp": "application/octet-stream", ".wtf": "text/plain"}


def media_type(name: str, head: bytes) -> str:
    """From the name's extension, else by sniffing the first bytes (UTF-8 without NUL)."""
    dot = name.rfind(".")
    ext = name[dot:].lower() if dot > name.rfind("/") else ""
    if ext in _EXTRA:
        return _EXTRA[ext]
    guessed, _ = _TYPES.guess_type("x" + ext, strict=False) if ext else (None, None)
    if guessed:
        return guessed
    if b"\x00" in head:
        return "application/octet-stream"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut at the sniff boundary is still text.
        if exc.start < len(head) - 3:
            return "application/octet-stream"
    return "text/plain"


class CatalogueBuilder:
    def __init__(self) -> None:
        self.sources: list[dict[str, Any]] = []

    def add(self, *, kind: str, human: bool, origin: dict[str, str], sha256: str | None,
            size: int | None, media: str, extra: dict[str, Any] | None = None) -> str:
        """A source; ``extra`` adds fields after the contracted ones (``minimized``,
        ``supplied``), only when there is something to say, so a catalogue without them
        has exactly the contracted shape."""
        source_id = f"S{len(self.sources) + 1}"
        self.sources.append({"source_id": source_id, "kind": kind, "human": human,
                             "origin": origin, "sha256": sha256, "size": size,
                             "media_type": media, **(extra or {})})
        return source_id

    def document(self) -> dict[str, Any]:
        return {"format": "viano-catalogue/1", "sources": self.sources}
