"""Viano's error tree, drawn once.

Every error a user can see carries a stable snake_case ``reason``, a sentence saying what
happened, a ``hint`` saying what to do next, and the CLI exit code it maps to::

    VianoError                         (exit 1: unexpected)
    ├── RejectedInput                  (exit 2: nothing was written)
    │   ├── ConfigError                config_invalid
    │   ├── InvalidCaseId              invalid_case_id
    │   ├── ReportRejected             invalid_report
    │   ├── InputRejected              invalid_input, duplicate_input, input_changed
    │   ├── ArchiveRejected            limit_exceeded, unsafe_archive_member,
    │   │                              duplicate_archive_member, encrypted_archive_member,
    │   │                              corrupt_archive
    │   ├── ImportRejected             invalid_export
    │   ├── ChangeRejected             invalid_change
    │   ├── NotFound                   unknown_case, unknown_generation, unknown_path
    │   ├── CaseExists                 case_exists
    │   └── StaleGeneration            stale_generation
    ├── CaseLocked                     locked (exit 11: DEFERRED, try again later)
    └── StorageError                   store_corrupt, store_unavailable, store_format

Lower-layer errors (sqlite3, zipfile, OSError, cattrs) are translated at the boundary with
``raise … from exc``; nothing above the engine ever sees them.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_REJECTED = 2
EXIT_VIOLATIONS = 1
EXIT_DEFERRED = 11


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


class ImportRejected(RejectedInput):
    default_reason = "invalid_export"
    default_hint = "Export the package again with 'viano export' and import the new file."


class ChangeRejected(RejectedInput):
    default_reason = "invalid_change"


class NotFound(RejectedInput):
    default_reason = "not_found"
    default_hint = "Run 'viano status' to list the cases in this store."


class CaseExists(RejectedInput):
    default_reason = "case_exists"
    default_hint = "Choose another --case-id, or inspect the existing case with 'viano show'."


class StaleGeneration(RejectedInput):
    default_reason = "stale_generation"
    default_hint = "Another writer advanced this package; read the current generation and retry."


class CaseLocked(VianoError):
    exit_code = EXIT_DEFERRED
    default_reason = "locked"
    default_hint = "Another process is working on this case; try again when it has finished."


class StorageError(VianoError):
    default_reason = "store_corrupt"
    default_hint = "Run 'viano verify' to list what is wrong with the store."
