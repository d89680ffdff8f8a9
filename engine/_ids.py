"""Identifier rules from the contract."""

from __future__ import annotations

import re
import uuid

from ._errors import InvalidCaseId

CASE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def validate_case_id(case_id: str) -> str:
    """Return ``case_id`` unchanged if it follows the contract, else refuse it."""
    if not isinstance(case_id, str) or CASE_ID.fullmatch(case_id) is None:
        raise InvalidCaseId(f"case id {case_id!r} is not valid")
    return case_id


def new_package_id() -> str:
    return str(uuid.uuid4())
