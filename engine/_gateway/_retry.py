"""Backoff and Retry-After: pure functions of attempt number, headers and an injected RNG."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime


def doubled(base_s: float, max_s: float, n: int) -> float:
    """``min(max_s, base_s * 2**n)`` for any ``n >= 0``. Written as it reads, it raised
    OverflowError from n = 1024 on (2**n does not fit a float), which a round count of
    the config's range reaches: the case ended in internal_error, its status stuck."""
    try:
        return float(min(max_s, math.ldexp(base_s, max(n, 0))))
    except OverflowError:  # past the largest float: past any cap
        return float(max_s)


def backoff_delay(retry_no: int, base_s: float, max_s: float, rng: random.Random) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(max, base * 2**n)]."""
    return rng.uniform(0.0, doubled(base_s, max_s, retry_no))


MAX_RETRY_AFTER_S = 366 * 86400.0  # longer than any cap the config allows (a day)


def retry_after_seconds(headers: Mapping[str, str], now: datetime | None = None) -> float | None:
    """``retry-after-ms`` (OpenAI), else ``Retry-After`` as seconds or an HTTP date. Always a
    finite number of seconds from 0 to MAX_RETRY_AFTER_S, or None: ``inf`` and ``1e400``
    parse as floats, and an infinite wait reached the round record, which the store cannot
    hold (the case ended in internal_error and its good answer from the next provider was
    lost); it is a wait longer than any cap. ``nan`` is no wait given."""
    lowered = {k.lower(): v for k, v in headers.items()}
    ms = lowered.get("retry-after-ms")
    if ms is not None:
        try:
            return _bounded(float(ms) / 1000.0)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if value is None:
        return None
    try:
        return _bounded(float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return _bounded((when - (now or datetime.now(UTC))).total_seconds())


def _bounded(seconds: float) -> float | None:
    if math.isnan(seconds):
        return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER_S)
