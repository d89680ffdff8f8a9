"""One generation of a package as the phases read it: its manifest and its files, through a
blocking reader that the caller supplies (the store, on a worker thread).

Everything a phase reads back is parsed strictly (an imported package is untrusted), and a
file that cannot be read or parsed is a :class:`HistoryProblem`, which the runner turns
into ``unsupported_history`` rather than an internal error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import IO, Any

import attrs

from .._errors import VianoError
from .._json import UntrustedJson, loads_untrusted
from .._store import Manifest

Reader = Callable[[str], bytes]     # sha256 -> bytes
Opener = Callable[[str], IO[bytes]]  # sha256 -> a readable, seekable stream


class HistoryProblem(Exception):
    """The package holds something a phase cannot stand on (missing, unreadable,
    inconsistent). Never raised for the model's faults."""


@attrs.frozen
class PackageView:
    manifest: Manifest
    reader: Reader = attrs.field(repr=False)
    opener: Opener | None = attrs.field(default=None, repr=False)

    def has(self, path: str) -> bool:
        return path in self.manifest.files

    def sha(self, path: str) -> str | None:
        entry = self.manifest.files.get(path)
        return None if entry is None else entry.sha256

    def read(self, path: str) -> bytes:
        entry = self.manifest.files.get(path)
        if entry is None:
            raise HistoryProblem(f"{path} is not in generation "
                                 f"{self.manifest.package_generation}")
        try:
            return self.reader(entry.sha256)
        except VianoError as exc:
            raise HistoryProblem(f"{path} cannot be read: {exc.message}") from exc

    def open(self, path: str) -> IO[bytes]:
        """A stream of a (possibly large) file; the caller closes it."""
        entry = self.manifest.files.get(path)
        if entry is None:
            raise HistoryProblem(f"{path} is not in generation "
                                 f"{self.manifest.package_generation}")
        if self.opener is None:
            import io

            return io.BytesIO(self.read(path))
        try:
            return self.opener(entry.sha256)
        except VianoError as exc:
            raise HistoryProblem(f"{path} cannot be read: {exc.message}") from exc

    def read_json(self, path: str) -> Any:
        try:
            return loads_untrusted(self.read(path))
        except UntrustedJson as exc:
            raise HistoryProblem(f"{path} is not acceptable JSON: {exc}") from exc

    def read_object(self, path: str) -> dict[str, Any]:
        doc = self.read_json(path)
        if not isinstance(doc, dict):
            raise HistoryProblem(f"{path} is not a JSON object")
        return doc
