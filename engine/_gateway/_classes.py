"""Failure classes of a provider attempt, decided by status code and exception type only —
never by message text (messages change between versions and providers).

    unavailable             connection refused/reset, timeouts, 408, 429, 5xx:
                            retried with backoff, then the next provider
    provider_configuration  400, 401, 403, 404, 422, other 4xx, 1xx/3xx, a 2xx other than
                            200 whose body is not the API's envelope (a queue's 202, a
                            proxy's 204), and a missing API key:
                            the next provider at once, no retry
    invalid_answer          a 200 whose envelope or content is not the contracted JSON,
                            or another 2xx envelope whose content is not:
                            recorded, no failover; the phase decides
"""

from __future__ import annotations

import enum

import httpx


class FailureClass(enum.StrEnum):
    UNAVAILABLE = "unavailable"
    CONFIGURATION = "provider_configuration"
    INVALID_ANSWER = "invalid_answer"
    SKIPPED = "skipped_cooldown"


CONFIGURATION_STATUSES = frozenset({400, 401, 403, 404, 422})


def classify_status(status: int) -> FailureClass | None:
    """``None`` for a 2xx; otherwise the class of that status."""
    if 200 <= status < 300:
        return None
    if status in CONFIGURATION_STATUSES:
        return FailureClass.CONFIGURATION
    if status in (408, 429) or status >= 500:
        return FailureClass.UNAVAILABLE
    # Other 4xx (405, 409, 413, 415 …) mean the request cannot succeed as configured.
    if 400 <= status < 500:
        return FailureClass.CONFIGURATION
    # 1xx/3xx reaching us (redirects are not followed) is a misconfigured endpoint.
    return FailureClass.CONFIGURATION


def classify_exception(exc: BaseException) -> FailureClass:
    """Transport failures are unavailability; a malformed URL, or a header value HTTP
    cannot carry, is configuration."""
    if isinstance(exc, (httpx.UnsupportedProtocol, httpx.InvalidURL, UnicodeEncodeError)):
        return FailureClass.CONFIGURATION
    return FailureClass.UNAVAILABLE
