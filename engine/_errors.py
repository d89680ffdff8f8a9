"""Viano's error tree, drawn once.

Every error a user can see carries a stable snake_case ``reason``, a sentence saying what
happened, a ``hint`` saying what to do next, and the CLI exit code it maps to::

    VianoError                         (exit 1: unexpected)
    ├── RejectedInput                  (exit 2: nothing was written)
    │   ├── UsageError                 usage_error
    │   ├── ConfigError                config_invalid
    │   ├── InvalidCaseId              invalid_case_id
    │   ├── ReportRejected             invalid_report, unknown_format, ambiguous_format
    │   ├── InputRejected              invalid_input, duplicate_input, input_changed,
    │   │                              unreadable_input, limit_exceeded
    │   ├── ArchiveRejected            limit_exceeded, unsafe_archive_member,
    │   │                              duplicate_archive_member, encrypted_archive_member,
    │   │                              corrupt_archive, unsupported_archive
    │   ├── ImportRejected             invalid_export
    │   ├── ChangeRejected             invalid_change
    │   ├── NotFound                   no_store, unknown_case, unknown_generation,
    │   │                              unknown_path, unknown_revision
    │   ├── NotAStore                  not_a_store
    │   ├── DestinationRejected        destination_exists, destination_in_store,
    │   │                              destination_invalid
    │   ├── CaseExists                 case_exists
    │   ├── StaleGeneration            stale_generation, lease_lost
    │   ├── HistoryConflict            package_mismatch, older_history, history_diverged
    │   └── PhaseRefused               no_interpretation, interpretation_mismatch,
    │                                  not_blocked, package_mismatch, unsupported_history
    ├── CaseLocked                     locked (exit 11: DEFERRED, try again later)
    ├── StorageError                   store_corrupt, store_unavailable, store_format,
    │                                  store_read_only, store_replaced
    └── GatewayError                   gateway_cancelled, gateway_closed

Lower-layer errors (sqlite3, zipfile, OSError, cattrs, trio) are translated at the boundary
with ``raise … from exc``; nothing above the engine ever sees them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_REJECTED = 2
EXIT_VIOLATIONS = 1
EXIT_RETRY_PENDING = 10
EXIT_DEFERRED = 11
EXIT_BLOCKED = 12
EXIT_ERROR = 13
EXIT_INTERRUPTED = 130


class VianoError(Exception):
    """Root of every error Viano raises on purpose."""

    exit_code = EXIT_INTERNAL
    default_reason = "internal_error"
    default_hint = "This is a bug in Viano; please report it with the command you ran."

    def __init__(self, message: str, *, reason: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.hint = hint or self.default_hint

    def to_json(self) -> dict[str, object]:
        return {"reason": self.reason, "message": self.message, "hint": self.hint,
                "exit_code": self.exit_code}


class RejectedInput(VianoError):
    """The input was refused before anything was written."""

    exit_code = EXIT_REJECTED
    default_reason = "rejected_input"
    default_hint = "Fix the input named in the message and run the command again."


class UsageError(RejectedInput):
    default_reason = "usage_error"
    default_hint = "Run the command with --help to see its arguments."


class ConfigError(RejectedInput):
    default_reason = "config_invalid"
    default_hint = ("Edit the configuration file named in the message; "
                    "see config/analysis.example.toml.")


class InvalidCaseId(RejectedInput):
    default_reason = "invalid_case_id"
    default_hint = ("Use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit "
                    "(for example --case-id BUG-20).")


class ReportRejected(RejectedInput):
    default_reason = "invalid_report"
    default_hint = ('Give a JSON report {"title", "body", "comments"?, "observations"?} '
                    "or a UTF-8 text file whose first line is the title.")


class InputRejected(RejectedInput):
    default_reason = "invalid_input"


class ArchiveRejected(RejectedInput):
    default_reason = "limit_exceeded"
    default_hint = ("Remove or repack the named member, or raise the limit in [intake.limits] "
                    "if the archive is trusted.")
    # A limit can be raised; what no limit allows (a member that escapes its folder, a link,
    # a device, a name that is not text; damage; a format this version cannot read) cannot.
    hints: ClassVar[Mapping[str, str]] = MappingProxyType({
        "unsafe_archive_member": "Repack the archive without the named member (or with a "
                                 "plain, relative, UTF-8 name for it); no setting allows it.",
        "corrupt_archive": "The archive is damaged or not what its name says: make it again "
                           "from the originals, or attach it as a plain file (role "
                           "'attachment').",
        "unsupported_archive": "Repack the archive with a common format and compression "
                               "(zip with deflate, tar, tar.gz), or attach it as a plain file "
                               "(role 'attachment').",
        "duplicate_archive_member": "Repack the archive with each member once (names that "
                                    "differ only in their Unicode form are the same name).",
        "encrypted_archive_member": "Attach the archive decrypted: no member of it can be "
                                    "read or checked encrypted.",
    })

    def __init__(self, message: str, *, reason: str | None = None, hint: str | None = None):
        super().__init__(message, reason=reason,
                         hint=hint or self.hints.get(reason or self.default_reason))


class ImportRejected(RejectedInput):
    default_reason = "invalid_export"
    default_hint = "Export the package again with 'viano export' and import the new file."


class ChangeRejected(RejectedInput):
    default_reason = "invalid_change"


class NotFound(RejectedInput):
    default_reason = "not_found"
    default_hint = "Run 'viano status' to list the cases in this store."


class NotAStore(RejectedInput):
    default_reason = "not_a_store"
    default_hint = ("Pass --store a folder that holds a Viano store, or a new or empty "
                    "folder to create one.")


class DestinationRejected(RejectedInput):
    default_reason = "destination_invalid"
    default_hint = "Choose a new file outside the store folder (or pass --force to replace it)."


class CaseExists(RejectedInput):
    default_reason = "case_exists"
    default_hint = "Choose another --case-id, or inspect the existing case with 'viano show'."


class StaleGeneration(RejectedInput):
    default_reason = "stale_generation"
    default_hint = "Another writer advanced this package; read the current generation and retry."


class HistoryConflict(RejectedInput):
    """A request whose history cannot join the store's, however often it is retried: a
    package id that belongs to another case, an export shorter than what the store holds,
    or one that diverges from it."""

    default_reason = "history_diverged"
    default_hint = ("The two stores changed this case independently: import the export into "
                    "another store (--store NEW) and compare them with 'viano log'.")


class PhaseRefused(RejectedInput):
    """A case operation (confirm, reopen, unblock, a dispatch for the wrong package) that
    the case's durable state does not allow; nothing was written."""

    default_reason = "refused"
    default_hint = "Run 'viano status CASE' and 'viano log CASE' to see where the case is."


class CaseLocked(VianoError):
    exit_code = EXIT_DEFERRED
    default_reason = "locked"
    default_hint = "Another process is working on this case; try again when it has finished."


class StorageError(VianoError):
    default_reason = "store_corrupt"
    default_hint = "Run 'viano verify' to list what is wrong with the store."


class GatewayError(VianoError):
    default_reason = "gateway_closed"
    default_hint = "Use the gateway handle only inside its 'async with open_gateway()'."


class GatewayCancelled(GatewayError):
    """The round was cancelled before it produced an outcome."""

    default_reason = "gateway_cancelled"
    default_hint = "The caller cancelled the round; nothing of it was recorded."


class InterruptedAfterCommit(KeyboardInterrupt):
    """Ctrl-C came while a publication that had been sent was being committed, and it
    was committed: the change is durable. A ``KeyboardInterrupt`` still (the command is
    interrupted), carrying the outcome, so that a command whose whole work was that one
    change can say it is done rather than ask to be run again."""

    def __init__(self, published: object):
        super().__init__("interrupted after the change was committed")
        self.published = published
