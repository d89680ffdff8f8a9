"""Intake: turn a report and attachments into the first generation of a case package.

:func:`prepare_intake` reads and checks everything — report shape, case id, every input
file, every archive member within the limits — and returns the complete change. It writes
nothing; a refusal therefore leaves the store exactly as it was. Originals are stored byte
for byte under ``inputs/<file name>``; the store re-hashes each one while copying it and
refuses the publication if it changed in between.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from .._canonical import artifact_json, sha256_hex
from .._config import MAX_DOCUMENT_BYTES, IntakeLimits
from .._errors import ArchiveRejected, ChangeRejected, InputRejected, UsageError
from .._ids import validate_case_id
from .._store import BytesSource, Change, FileSource, Manifest, validate_logical_path
from .._store._sources import (
    BlobSource,
    NotRegularFile,
    WouldWait,
    hash_stream,
    open_regular,
)
from ._archives import (
    UNREAD_SUFFIXES,
    archive_kind,
    is_empty_tar,
    named_kind,
    scan_open_archive,
    unread_archive,
)
from ._catalogue import CatalogueBuilder, media_type
from ._formats import READERS, parse_report
from ._report import Report

ROLES = ("diagnostics", "source", "attachment")
EXPANDED_ROLES = ("diagnostics", "source")  # archives in these roles are catalogued by member
INTAKE_PHASE = "INTAKE"


@attrs.frozen
class Attachment:
    role: str
    path: Path

    @classmethod
    def parse(cls, spec: str) -> Attachment:
        """``[ROLE=]FILE``. A prefix that is not a known role is part of the file name
        only if that file exists: ``diag=log.txt`` is a misspelt role, not a file named
        so, and ``source=`` names no file at all."""
        role, sep, rest = spec.partition("=")
        if sep and role in ROLES:
            if not rest:
                raise UsageError(f"--attach {spec!r} names no file after '{role}='",
                                 hint=f"Write --attach {role}=PATH.")
            return cls(role=role, path=Path(rest))
        if sep and re.fullmatch(r"[A-Za-z_-]+", role) and not Path(spec).exists():
            raise UsageError(f"--attach {spec!r}: {role!r} is not a role (and no file of "
                             "that whole name exists)",
                             hint=f"Use one of {', '.join(ROLES)}, e.g. --attach "
                                  f"diagnostics={rest or 'PATH'}.")
        return cls(role="attachment", path=Path(spec))


@attrs.frozen
class IntakePlan:
    case_id: str
    change: Change
    catalogue: dict[str, Any]
    title: str

    def is_in(self, manifest: Manifest) -> bool:
        """Whether this very intake is already in the case whose head is ``manifest``:
        every file it would write is there with the same bytes (inputs and case/ documents
        are write-once, so a later head still holds them as written). The one rule single
        and bulk intake use for "already present"."""
        return self._held(manifest, "")

    def same_originals(self, manifest: Manifest) -> bool:
        """Whether the case whose head is ``manifest`` holds exactly the originals this
        intake would store (``inputs/``), byte for byte, whatever its own documents say (a
        catalogue built from the attachments in another order, or under other limits)."""
        ours = {p for p in self.change.files if p.startswith("inputs/")}
        return ours == set(manifest.paths_under("inputs/")) and self._held(manifest, "inputs/")

    def _held(self, manifest: Manifest, prefix: str) -> bool:
        held = manifest.files
        return all(path in held and held[path].sha256 == source.sha256
                   for path, source in self.change.files.items() if path.startswith(prefix))


def prepare_intake(report_path: Path, attachments: Sequence[Attachment], *,
                   case_id: str | None, limits: IntakeLimits,
                   progress: Callable[[int], None] | None = None,
                   report_format: str | None = None,
                   report_bytes: bytes | None = None, report_name: str | None = None,
                   json_only: bool = False) -> IntakePlan:
    """Everything a case's first generation holds, read and checked; nothing written.

    ``report_format`` is one of :data:`FORMATS` (``None``: detected from the content).
    ``report_bytes`` (with ``report_name``) gives the report's bytes instead of reading
    ``report_path`` (a line of a JSON Lines file, ``json_only``); ``report_path`` then only
    labels it."""
    files: dict[str, BlobSource] = {}
    names: list[str] = []

    def input_name(path: Path, given: str | None = None) -> str:
        try:
            (given or path.name).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InputRejected(f"{_shown(path)}: the file name is not UTF-8 text",
                                hint="Rename the file to a UTF-8 name and run the command "
                                     "again.") from exc
        name = f"inputs/{given or path.name}"
        try:
            validate_logical_path(name)
        except ChangeRejected as exc:
            raise InputRejected(f"{path}: the file name cannot be stored") from exc
        if name in names:
            raise InputRejected(f"{path}: another input is already named {path.name!r}",
                                reason="duplicate_input",
                                hint="Rename one of the files so every input name is unique.")
        names.append(name)
        return name

    stored_name = input_name(report_path, report_name)
    if report_bytes is None:
        raw = _read_small(report_path, limits.max_report_bytes)
    elif len(report_bytes) > limits.max_report_bytes:
        raise InputRejected(f"{_shown(report_path)}: larger than max_report_bytes="
                            f"{limits.max_report_bytes}", reason="limit_exceeded")
    else:
        raw = report_bytes
    report = parse_report(raw, _shown(report_path), report_format, json_only=json_only)
    sources = len(report.texts) + len(report.referenced)
    if sources > limits.max_members:
        # Each is a source of the catalogue (~330 bytes of it for ~26 of input): 640,000
        # one-line comments in a 16 MB report took 2 GB to take in, and gave a catalogue
        # larger than a phase reads, which verify then reported; a Jira issue's listed
        # attachments the same.
        raise InputRejected(f"{_shown(report_path)}: {sources} sources (the body, comments, "
                            f"observations and attachments it lists), more than max_members="
                            f"{limits.max_members}", reason="limit_exceeded",
                            hint="Raise [intake.limits] max_members, or take the report in "
                                 "without most of its comments.")
    chosen, chosen_from = _choose_case_id(case_id, report, raw)
    files[stored_name] = BytesSource.of(raw)

    cat = CatalogueBuilder()
    catalogue_report(cat, report, stored_name, raw)
    inputs_doc: list[dict[str, Any]] = [{
        "input": stored_name, "role": "report", "format": report.format,
        "sha256": files[stored_name].sha256, "size": len(raw)}]
    if READERS.get(report.format, 1) > 1:  # none recorded is reader 1, as before readers
        inputs_doc[0]["reader"] = READERS[report.format]
    supplied: dict[str, tuple[str, int]] = {}  # file name: (input, size)
    for att in attachments:
        name = input_name(att.path)
        # max_members bounds a case's sources, not each input's: ten archives of
        # max_members members each were a case of ten times that many.
        left = limits.max_members - sources
        with _readable(att.path):
            source, doc = _catalogue_attachment(cat, att, name, limits, progress, left)
        sources += doc.get("members", 1)
        files[name] = source
        inputs_doc.append(doc)
        supplied.setdefault(att.path.name, (name, source.size))
    _catalogue_referenced(cat, report, stored_name, supplied)

    catalogue = cat.document()
    intake_doc: dict[str, Any] = {
        "format": "viano-intake/1", "case_id": chosen, "case_id_from": chosen_from,
        "title": report.title, "inputs": inputs_doc, "limits": attrs.asdict(limits)}
    if report.issue is not None:
        intake_doc["issue"] = dict(report.issue)
    catalogue_bytes = artifact_json(catalogue)
    if len(catalogue_bytes) > MAX_DOCUMENT_BYTES:
        raise InputRejected(f"{_shown(report_path)}: its catalogue would be "
                            f"{len(catalogue_bytes)} bytes, more than the {MAX_DOCUMENT_BYTES} "
                            "a phase reads whole", reason="limit_exceeded",
                            hint="Take the case in with fewer sources (attachments, archive "
                                 "members, comments).")
    files["case/catalogue.json"] = BytesSource.of(catalogue_bytes)
    files["case/intake.json"] = BytesSource.of(artifact_json(intake_doc))
    change = Change(files=files, pointers={"catalogue": "case/catalogue.json",
                                           "intake": "case/intake.json"},
                    phase=INTAKE_PHASE, analysis_revision=1)
    return IntakePlan(case_id=chosen, change=change, catalogue=catalogue, title=report.title)


def _choose_case_id(flag: str | None, report: Report, raw: bytes) -> tuple[str, str]:
    if flag is not None:
        return validate_case_id(flag), "flag"
    if report.case_id is not None:
        return report.case_id, "report"
    if report.identity is not None:
        return validate_case_id(report.identity), "issue"
    return f"case-{sha256_hex(raw)[:12]}", "derived"


def catalogue_report(cat: CatalogueBuilder, report: Report, name: str, raw: bytes) -> None:
    """The report's texts, in report order. A text report is one source: the whole file,
    hashed as stored (with a byte-order mark, if it has one)."""
    for t in report.texts:
        if t.pointer is None:
            cat.add(kind=t.kind, human=t.human, origin={"input": name},
                    sha256=sha256_hex(raw), size=len(raw), media="text/plain")
            continue
        data = t.text.encode("utf-8")
        origin = {"input": name, "pointer": t.pointer}
        if t.conversion is not None:
            origin["conversion"] = t.conversion
        cat.add(kind=t.kind, human=t.human, origin=origin, sha256=sha256_hex(data),
                size=len(data), media="text/plain", extra=dict(t.marks))


def _catalogue_referenced(cat: CatalogueBuilder, report: Report, name: str,
                          supplied: dict[str, tuple[str, int]]) -> None:
    """Attachments the report lists (Jira): each recorded, after the supplied inputs, as
    supplied (naming the input of the same file name) or as referenced, not supplied. A
    supplied file is one listed attachment's, not every one of its name's (two listed
    ``shot.png`` were both marked supplied by one file): the one whose listed size is the
    file's, else the first of that name."""
    bases = [ref.name.replace("\\", "/").rsplit("/", 1)[-1] for ref in report.referenced]
    claimed: dict[str, int] = {}  # file name: the listed attachment it is
    for i, (ref, b) in enumerate(zip(report.referenced, bases, strict=True)):
        if b not in supplied:
            continue
        given = supplied[b][1]
        if b not in claimed or (ref.size == given
                                and report.referenced[claimed[b]].size != given):
            claimed[b] = i
    for i, (ref, b) in enumerate(zip(report.referenced, bases, strict=True)):
        size = ref.size if ref.size is not None and 0 <= ref.size <= 2**62 else None
        extra: dict[str, Any] = {"name": ref.name}
        if claimed.get(b) == i:
            extra |= {"supplied": True, "supplied_as": supplied[b][0]}
        else:
            extra |= {"supplied": False}
        media = ref.media_type if ref.media_type and _MEDIA.fullmatch(ref.media_type) \
            else media_type(ref.name, b"\x00")
        cat.add(kind="attachment", human=False, origin={"input": name, "pointer": ref.pointer},
                sha256=None, size=size, media=media, extra=extra)


_MEDIA = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]{0,62}/[a-z0-9][a-z0-9!#$&^_.+-]{0,62}")


def _catalogue_attachment(cat: CatalogueBuilder, att: Attachment, name: str,
                          limits: IntakeLimits, progress: Callable[[int], None] | None,
                          members_left: int) -> tuple[BlobSource, dict[str, Any]]:
    """Catalogue one attachment: a file as one source, an archive as its members (at most
    ``members_left`` of them: what the case's other sources leave of max_members)."""
    check_regular(att.path)
    kind = archive_kind(att.path) if att.role in EXPANDED_ROLES else None
    claimed = named_kind(att.path.name)
    if kind is None and att.role in EXPANDED_ROLES:
        if claimed in ("tar", "tar.gz") and is_empty_tar(att.path, claimed):
            kind = claimed  # an empty archive: no members to catalogue
        elif att.path.name.lower().endswith(UNREAD_SUFFIXES) or unread_archive(att.path):
            raise ArchiveRejected(f"{att.path}: an archive of a kind intake does not read "
                                  "(it reads .zip, .tar and .tar.gz), so its members would "
                                  "not be catalogued", reason="unsupported_archive",
                                  hint="Repack it as .zip or .tar.gz, or attach it with the "
                                       "'attachment' role to store it as one file.")
        elif claimed is not None:
            raise ArchiveRejected(f"{att.path}: named like a {claimed} archive, but its "
                                  "content is not one", reason="corrupt_archive",
                                  hint="Attach the real archive, or attach the file with "
                                       "the 'attachment' role to store it as it is.")
    if kind is None:
        if members_left < 1:
            raise InputRejected(f"{_shown(att.path)}: the case already has max_members="
                                f"{limits.max_members} sources", reason="limit_exceeded",
                                hint="Raise [intake.limits] max_members, or attach fewer "
                                     "files.")
        size_limit = limits.max_member_bytes
        with open_regular(att.path) as f:
            digest, size = hash_stream(f, size_limit)
            f.seek(0)
            head = f.read(4096)
        if size > size_limit:
            raise InputRejected(f"{att.path}: larger than max_member_bytes={size_limit}",
                                reason="limit_exceeded")
        cat.add(kind=att.role, human=False, origin={"input": name}, sha256=digest, size=size,
                media=media_type(att.path.name, head))
        source = FileSource(path=att.path, sha256=digest, size=size)
        return source, {"input": name, "role": att.role, "sha256": digest, "size": size,
                        "archive": None}
    if att.path.stat().st_size > limits.max_total_bytes:
        raise InputRejected(f"{att.path}: larger than max_total_bytes={limits.max_total_bytes}",
                            reason="limit_exceeded",
                            hint="Attach a smaller archive, or raise the limit "
                                 "([intake.limits] max_total_bytes) if it is trusted.")
    # One open file for the hash, the scan and the hash again: a file renamed over the
    # path meanwhile is not read, and one changed in place shows in the second hash. The
    # store re-hashes the path at commit, so a swap after this is refused there.
    with open_regular(att.path) as f:
        digest, size = hash_stream(f)
        members = scan_open_archive(f, kind, limits, str(att.path), progress,
                                    members_left=members_left)
        f.seek(0)
        if hash_stream(f) != (digest, size):
            raise InputRejected(f"{_shown(att.path)}: the archive changed while it was read",
                                reason="input_changed",
                                hint="Do not modify input files while Viano reads them.")
    for m in sorted(members, key=lambda m: m.name.encode("utf-8")):
        cat.add(kind=att.role, human=False, origin={"input": name, "member": m.name},
                sha256=m.sha256, size=m.size, media=media_type(m.name, m.head))
    source = FileSource(path=att.path, sha256=digest, size=size)
    return source, {"input": name, "role": att.role, "sha256": source.sha256,
                    "size": source.size, "archive": kind, "members": len(members)}


def _shown(path: Path) -> str:
    return str(path).encode("utf-8", "backslashreplace").decode("utf-8")


def check_regular(path: Path) -> None:
    """A file Viano is to read (a report, an attachment, an export) exists, can be opened
    and is a regular file: a folder, a FIFO or a device is refused, never read (a FIFO would
    block, a device never ends). Every later open of it goes through ``open_regular`` too,
    so a file swapped for one of those after this check is refused there, not read."""
    try:
        open_regular(path).close()
    except FileNotFoundError as exc:
        raise InputRejected(f"{_shown(path)}: no such file",
                            hint="Check the path and run the command again.") from exc
    except NotRegularFile as exc:
        raise InputRejected(f"{_shown(path)}: {exc.kind}, not a regular file",
                            hint="Name a regular file.") from exc
    except OSError as exc:
        raise unreadable(path, exc) from exc


def unreadable(path: Path, exc: OSError) -> InputRejected:
    """The refusal of an input that could not be read (permissions, I/O, a pseudo-file)."""
    hint = ("Copy what you need from it into a regular file, and name that file."
            if isinstance(exc, WouldWait) else
            "Check that the file is readable by you and run the command again.")
    return InputRejected(f"{_shown(path)}: cannot be read ({exc.strerror or exc})",
                         reason="unreadable_input", hint=hint)


@contextmanager
def _readable(path: Path) -> Iterator[None]:
    """An input that cannot be read (permissions, I/O error) is a refusal, not a crash."""
    try:
        yield
    except OSError as exc:
        raise unreadable(path, exc) from exc


def _read_small(path: Path, limit: int) -> bytes:
    check_regular(path)
    with _readable(path), open_regular(path) as f:
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise InputRejected(f"{_shown(path)}: larger than max_report_bytes={limit}",
                            reason="limit_exceeded",
                            hint="A report is text; attach large files with --attach.")
    return raw
