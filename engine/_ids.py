"""Identifier rules from the contract."""

from __future__ import annotations

import hashlib
import re
import uuid

import attrs

from ._errors import InvalidCaseId, UsageError

CASE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def validate_case_id(case_id: str) -> str:
    """Return ``case_id`` unchanged if it follows the contract, else refuse it."""
    if not isinstance(case_id, str) or CASE_ID.fullmatch(case_id) is None:
        raise InvalidCaseId(f"case id {case_id!r} is not valid")
    return case_id


def new_package_id() -> str:
    return str(uuid.uuid4())


MAX_SHARDS = 256


def shard_of(case_id: str, count: int) -> int:
    """Which of ``count`` shards holds ``case_id``: the first four bytes of its MD5, big
    endian, modulo ``count``. Stable across processes, hosts and backends (PostgreSQL
    computes the same in SQL: ``SHARD_SQL``)."""
    digest = hashlib.md5(case_id.encode("utf-8"), usedforsecurity=False).digest()
    return int.from_bytes(digest[:4], "big") % count


# The same as shard_of, in PostgreSQL's SQL (the first 8 hex digits of md5, as a 32-bit
# value, then widened without a sign). Its two parameters: count, then index.
SHARD_SQL = ("mod(('x' || substr(md5(case_id), 1, 8))::bit(32)::bigint, %s) = %s")


@attrs.frozen
class Shard:
    """One of ``count`` disjoint parts of the case ids (``index`` from 0), by
    :func:`shard_of`: processes sharing one store each take only their part of its due
    index, so they never reach for each other's cases."""

    index: int
    count: int

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.count <= MAX_SHARDS or not 0 <= self.index < self.count:
            raise UsageError(f"shard {self.index + 1}/{self.count} is not one of 1..count "
                             f"with a count of 1 to {MAX_SHARDS}")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"2/4"``: the second of four (1-based, as it is shown)."""
        index, sep, count = text.partition("/")
        if not sep or not index.isdigit() or not count.isdigit():
            raise UsageError(f"{text!r} is not a shard: give it as INDEX/COUNT, such as 2/4")
        return cls(int(index) - 1, int(count))

    def holds(self, case_id: str) -> bool:
        return shard_of(case_id, self.count) == self.index

    def __str__(self) -> str:
        return f"{self.index + 1}/{self.count}"
