"""Intake: turn a report and attachments into the first generation of a case package.

:func:`prepare_intake` reads and checks everything — report shape, case id, every input
file, every archive member within the limits — and returns the complete change. It writes
nothing; a refusal therefore leaves the store exactly as it was. Originals are stored byte
for byte under ``inputs/<file name>``; the store re-hashes each one while copying it and
refuses the publication if it changed in between.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from .._canonical import artifact_json, sha256_hex
from .._config import IntakeLimits
from .._errors import ArchiveRejected, ChangeRejected, InputRejected, UsageError
from .._ids import validate_case_id
from .._store import BytesSource, Change, FileSource, validate_logical_path
from .._store._sources import BlobSource, hash_stream
from ._archives import archive_kind, named_kind, scan_open_archive
from ._catalogue import CatalogueBuilder, media_type
from ._report import parse_report

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


def prepare_intake(report_path: Path, attachments: Sequence[Attachment], *,
                   case_id: str | None, limits: IntakeLimits,
                   progress: Callable[[int], None] | None = None) -> IntakePlan:
    files: dict[str, BlobSource] = {}
    names: list[str] = []

    def input_name(path: Path) -> str:
        try:
            path.name.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InputRejected(f"{_shown(path)}: the file name is not UTF-8 text",
                                hint="Rename the file to a UTF-8 name and run the command "
                                     "again.") from exc
        name = f"inputs/{path.name}"
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

    report_name = input_name(report_path)
    raw = _read_small(report_path, limits.max_report_bytes)
    report = parse_report(raw, str(report_path))
    chosen, chosen_from = _choose_case_id(case_id, report.case_id, raw)
    files[report_name] = BytesSource.of(raw)

    cat = CatalogueBuilder()
    _catalogue_report(cat, report, report_name, raw)
    inputs_doc = [{"input": report_name, "role": "report", "format": report.format,
                   "sha256": files[report_name].sha256, "size": len(raw)}]
    for att in attachments:
        name = input_name(att.path)
        with _readable(att.path):
            source, doc = _catalogue_attachment(cat, att, name, limits, progress)
        files[name] = source
        inputs_doc.append(doc)

    catalogue = cat.document()
    intake_doc = {"format": "viano-intake/1", "case_id": chosen, "case_id_from": chosen_from,
                  "title": report.title, "inputs": inputs_doc,
                  "limits": attrs.asdict(limits)}
    files["case/catalogue.json"] = BytesSource.of(artifact_json(catalogue))
    files["case/intake.json"] = BytesSource.of(artifact_json(intake_doc))
    change = Change(files=files, pointers={"catalogue": "case/catalogue.json",
                                           "intake": "case/intake.json"},
                    phase=INTAKE_PHASE, analysis_revision=1)
    return IntakePlan(case_id=chosen, change=change, catalogue=catalogue, title=report.title)


def _choose_case_id(flag: str | None, from_report: str | None, raw: bytes) -> tuple[str, str]:
    if flag is not None:
        return validate_case_id(flag), "flag"
    if from_report is not None:
        return from_report, "report"
    return f"case-{sha256_hex(raw)[:12]}", "derived"


def _catalogue_report(cat: CatalogueBuilder, report: Any, name: str, raw: bytes) -> None:
    if report.format == "text":
        cat.add(kind="report", human=True, origin={"input": name}, sha256=sha256_hex(raw),
                size=len(raw), media="text/plain")
        return
    texts = [("report", "/body", report.body)]
    texts += [("comment", f"/comments/{i}/body", c.body) for i, c in enumerate(report.comments)]
    texts += [("observation", f"/observations/{i}/body", o.body)
              for i, o in enumerate(report.observations)]
    for kind, pointer, text in texts:
        data = text.encode("utf-8")
        cat.add(kind=kind, human=True, origin={"input": name, "pointer": pointer},
                sha256=sha256_hex(data), size=len(data), media="text/plain")


def _catalogue_attachment(cat: CatalogueBuilder, att: Attachment, name: str,
                          limits: IntakeLimits, progress: Callable[[int], None] | None,
                          ) -> tuple[BlobSource, dict[str, Any]]:
    _check_regular(att.path)
    kind = archive_kind(att.path) if att.role in EXPANDED_ROLES else None
    claimed = named_kind(att.path.name)
    if kind is None and att.role in EXPANDED_ROLES and claimed is not None:
        raise ArchiveRejected(f"{att.path}: named like a {claimed} archive, but its content "
                              "is not one", reason="corrupt_archive",
                              hint="Attach the real archive, or attach the file with the "
                                   "'attachment' role to store it as it is.")
    if kind is None:
        size_limit = limits.max_member_bytes
        with att.path.open("rb") as f:
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
                            reason="limit_exceeded")
    # One open file for the hash, the scan and the hash again: a file renamed over the
    # path meanwhile is not read, and one changed in place shows in the second hash. The
    # store re-hashes the path at commit, so a swap after this is refused there.
    with att.path.open("rb") as f:
        digest, size = hash_stream(f)
        members = scan_open_archive(f, kind, limits, str(att.path), progress)
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


def _check_regular(path: Path) -> None:
    try:
        st = path.stat()
    except FileNotFoundError as exc:
        raise InputRejected(f"{_shown(path)}: no such file") from exc
    except OSError as exc:
        raise InputRejected(f"{_shown(path)}: cannot be read ({exc.strerror})",
                            reason="unreadable_input") from exc
    if not stat.S_ISREG(st.st_mode):
        raise InputRejected(f"{_shown(path)}: not a regular file")


@contextmanager
def _readable(path: Path) -> Iterator[None]:
    """An input that cannot be read (permissions, I/O error) is a refusal, not a crash."""
    try:
        yield
    except OSError as exc:
        raise InputRejected(f"{_shown(path)}: cannot be read ({exc.strerror or exc})",
                            reason="unreadable_input",
                            hint="Check that the file is readable by you and run the command "
                                 "again.") from exc


def _read_small(path: Path, limit: int) -> bytes:
    _check_regular(path)
    with _readable(path), path.open("rb") as f:
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise InputRejected(f"{_shown(path)}: larger than max_report_bytes={limit}",
                            reason="limit_exceeded",
                            hint="A report is text; attach large files with --attach.")
    return raw
