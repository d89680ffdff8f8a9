"""Configuration: one TOML file, loaded strictly.

Unknown keys, wrong types (no coercion; ``true`` is not a count), non-positive counts and
``min > max`` are refused with a message naming the key and the file, before anything runs.
API keys never live in the file: a provider names the environment variable that holds one.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import attrs
import cattrs
import httpx

from ._errors import ConfigError
from ._store._sources import NotRegularFile, WouldWait, open_regular
from ._strict import STRICT, structure_errors

DEFAULT_CONFIG_PATH = Path("config/analysis.local.toml")
MAX_CONFIG_BYTES = 1 << 20
# The largest file a phase reads whole (a report, a context, a round record): ten times
# what the default limits let any of them reach. Larger is refused unread, so a crafted
# store or export cannot make a phase check hold a huge document in memory.
MAX_DOCUMENT_BYTES = 128 * 1024 * 1024
ProviderKind = Literal["openai", "anthropic", "fixture"]


def _finite(attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{attribute.name} must be a finite number, got {value}")


# Upper bounds of the numbers a configuration may set. Each is far above any sensible
# value and low enough that everything computed from it stays representable and cheap:
# a due time within the calendar, a read buffer that can be allocated, a round count a
# store row holds, a gateway that starts at once. A new number needs its range here.
MAX_COUNT = 1_000_000
MAX_SECONDS = 10 * 365 * 86400  # ten years: now + this is a date every platform holds
MAX_BYTES = 2**62  # what a store's size columns hold


def _number(default: float, low: float, high: float, *, above: bool = False) -> Any:
    """A number field from ``low`` (exclusive if ``above``) to ``high``, finite; its range
    is kept in the field's metadata, so the tests can try both ends of every field."""
    def check(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        _finite(attribute, value)
        if not ((value > low) if above else (value >= low)) or not value <= high:
            start = f"more than {low:g}" if above else f"from {low:g}"
            raise ValueError(f"{attribute.name} must be {start} to {high:g}, got {value}")
    return attrs.field(default=default, validator=check,
                       metadata={"range": (low, high, above)})


def _count(default: int, high: int = MAX_COUNT, low: int = 1) -> Any:
    return _number(default, low, high)


def _bytes(default: int, high: int = MAX_DOCUMENT_BYTES) -> Any:
    return _number(default, 1, high)


def _seconds(default: float, high: float = MAX_SECONDS, *, zero: bool = False) -> Any:
    return _number(default, 0, high, above=not zero)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def _env_name(_inst: Any, attribute: attrs.Attribute[Any], value: str | None) -> None:
    """A variable's name, never its value: a pasted key is refused without being echoed."""
    if value is not None and _ENV_NAME.fullmatch(value) is None:
        raise ValueError(f"{attribute.name} must be the name of an environment variable "
                         "(letters, digits and '_', not starting with a digit); the value "
                         "given is not shown, in case it is a key")


def _location(_inst: Any, attribute: attrs.Attribute[Any], value: str | None) -> None:
    """A store's folder or database: not empty (it was taken as the default, silently)
    and without NUL (no path or URL holds one; it failed deep in the first mkdir as an
    internal error). Not echoed: a database URL may carry a password."""
    if value is not None and (not value.strip() or "\x00" in value):
        raise ValueError(f"{attribute.name} must name a folder or a database (it is empty "
                         "or holds a NUL); leave it out to use the default")


@attrs.frozen
class HypothesisLimits:
    max_context_bytes: int = _bytes(1_048_576)
    max_prior_generations: int = _count(32, 100_000)
    max_output_bytes: int = _bytes(2_097_152)
    max_summary_bytes: int = _bytes(2_097_152)


@attrs.frozen
class HypothesisPolicy:
    min_hypotheses: int = _count(3, 1000)
    max_hypotheses: int = _count(5, 1000)
    initial_budget: int = _count(100, 10**12)
    limits: HypothesisLimits = attrs.field(factory=HypothesisLimits)

    def __attrs_post_init__(self) -> None:
        if self.min_hypotheses > self.max_hypotheses:
            raise ValueError(f"min_hypotheses ({self.min_hypotheses}) exceeds "
                             f"max_hypotheses ({self.max_hypotheses})")


@attrs.frozen
class InterpretationLimits:
    """Bounds of the interpretation context and answer. Exceeding one is ERROR
    ``limit_exceeded``; nothing is truncated silently. Excerpts of textual attachments are
    bounded by design (each to ``max_excerpt_bytes``, all together to
    ``max_excerpts_total_bytes``) and the context records exactly what was excerpted."""

    max_context_bytes: int = _bytes(1_048_576)
    max_excerpt_bytes: int = _bytes(8_192)
    max_excerpts_total_bytes: int = _bytes(262_144)
    max_output_bytes: int = _bytes(2_097_152)
    max_summary_bytes: int = _bytes(2_097_152)


@attrs.frozen
class InterpretationPolicy:
    auto_confirm: bool = False
    limits: InterpretationLimits = attrs.field(factory=InterpretationLimits)


@attrs.frozen
class RetryPolicy:
    max_rounds: int = _count(10)
    base_delay_s: float = _seconds(30.0)
    max_delay_s: float = _seconds(3600.0)

    def __attrs_post_init__(self) -> None:
        if self.base_delay_s > self.max_delay_s:
            raise ValueError(f"base_delay_s ({self.base_delay_s}) exceeds "
                             f"max_delay_s ({self.max_delay_s})")


@attrs.frozen
class IntakeLimits:
    """Limits applied to every archive read (intake and import)."""

    max_members: int = _count(20_000)
    max_member_bytes: int = _bytes(268_435_456, MAX_BYTES)
    max_total_bytes: int = _bytes(1_073_741_824, MAX_BYTES)
    max_compression_ratio: float = _number(200.0, 0, 1e6, above=True)
    max_report_bytes: int = _bytes(16_777_216)

    def __attrs_post_init__(self) -> None:
        if self.max_report_bytes > MAX_DOCUMENT_BYTES:
            raise ValueError(f"max_report_bytes ({self.max_report_bytes}) exceeds "
                             f"{MAX_DOCUMENT_BYTES}, the most a phase reads whole")
        if self.max_member_bytes > self.max_total_bytes:
            raise ValueError(f"max_member_bytes ({self.max_member_bytes}) exceeds "
                             f"max_total_bytes ({self.max_total_bytes})")


@attrs.frozen
class IntakeConfig:
    limits: IntakeLimits = attrs.field(factory=IntakeLimits)


@attrs.frozen
class ProviderConfig:
    name: str
    kind: ProviderKind
    base_url: str = ""
    model: str = ""
    api_key_env: str | None = attrs.field(default=None, validator=_env_name)
    path: str | None = None
    timeout_s: float = _seconds(120.0, 86400)
    retries: int = _count(2, 100, low=0)
    max_concurrency: int = _count(8, 4096)

    def __attrs_post_init__(self) -> None:
        if not self.name.strip():
            raise ValueError("name must not be blank")
        unused = ([k for k in ("base_url", "model", "api_key_env") if getattr(self, k)]
                  if self.kind == "fixture" else ["path"] if self.path is not None else [])
        if unused:
            # Named, never echoed: a base_url may carry credentials. Accepted, a setting
            # the kind does not read looked like it was in force (a path on openai).
            raise ValueError(f"provider {self.name!r} of kind {self.kind!r} does not use "
                             f"{', '.join(repr(k) for k in unused)}: remove it, or change "
                             f"'kind'")
        if self.kind == "fixture" and not self.path:
            raise ValueError(f"provider {self.name!r} of kind 'fixture' needs 'path'")
        if self.kind != "fixture" and not (self.base_url and self.model):
            raise ValueError(f"provider {self.name!r} of kind {self.kind!r} needs "
                             "'base_url' and 'model'")
        if self.kind != "fixture" and not _http_url(self.base_url):
            # Not echoed: a base_url may carry credentials (userinfo, a key parameter).
            raise ValueError(f"provider {self.name!r}: base_url must be an http:// or "
                             "https:// URL with a host")


def _http_url(url: str) -> bool:
    """Whether the HTTP client will call ``url`` as written: http(s), a host and a port
    (urlsplit's view), and the same for httpx, which refuses some of what urlsplit takes
    (``[::1]x``, an invalid IDNA label) and percent-encodes a space in a host. A space or
    a control character anywhere is refused: no server is named with one."""
    if any(c <= " " or "\x7f" <= c <= "\x9f" for c in url):
        return False
    try:
        parts = urlsplit(url)
        port = parts.port  # a port that is not a number raises here
        theirs = httpx.URL(url).host  # decoded: a bad A-label raises IDNAError
    except (httpx.InvalidURL, ValueError):  # IDNAError is a ValueError (UnicodeError)
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and bool(theirs) and \
        (port is None or port > 0)


@attrs.frozen
class GatewayConfig:
    """How the gateway retries within a round (the round itself is never slept across)."""

    connect_timeout_s: float = _seconds(10.0, 3600)
    backoff_base_s: float = _seconds(0.5, 3600)
    backoff_max_s: float = _seconds(8.0, 3600)
    retry_after_cap_s: float = _seconds(30.0, 86400, zero=True)
    cooldown_after: int = _count(3)
    cooldown_s: float = _seconds(60.0, 86400, zero=True)
    max_connections: int = _count(16, 1024)
    max_output_bytes: int = _bytes(2_097_152)


@attrs.frozen
class StoreConfig:
    """``[store]``: where the store lives. ``--store``/``VIANO_STORE`` override ``url``."""

    url: str | None = attrs.field(default=None, validator=_location)
    blob_root: str | None = attrs.field(default=None, validator=_location)
    # Renewed every lease_s / 3, and a dead worker's cases wait lease_s: under 1 s the
    # renewals would flood the database, over a day a crash would stall its cases.
    lease_s: float = _number(30.0, 1, 86400)


@attrs.frozen
class Config:
    hypotheses: HypothesisPolicy = attrs.field(factory=HypothesisPolicy)
    interpretation: InterpretationPolicy = attrs.field(factory=InterpretationPolicy)
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    intake: IntakeConfig = attrs.field(factory=IntakeConfig)
    gateway: GatewayConfig = attrs.field(factory=GatewayConfig)
    store: StoreConfig = attrs.field(factory=StoreConfig)
    providers: tuple[ProviderConfig, ...] = ()
    source: str = attrs.field(default="(built-in defaults)", eq=False)

    def __attrs_post_init__(self) -> None:
        names = [p.name for p in self.providers]
        if len(set(names)) != len(names):
            raise ValueError(f"provider names must be unique, got {names}")

    @classmethod
    def defaults(cls) -> Config:
        return cls()

    @classmethod
    def from_mapping(cls, data: dict[str, Any], *, source: str) -> Config:
        """Structure an already-parsed TOML document, refusing anything not contracted."""
        if "source" in data:
            raise ConfigError(f"{source}: unknown key 'source'")
        try:
            config = STRICT.structure(data, cls)
        except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
            details = "; ".join(structure_errors(exc)) if isinstance(
                exc, cattrs.BaseValidationError) else str(exc)
            hint = None
            if isinstance(data.get("providers"), dict):  # the likeliest slip of all
                hint = ("Write each provider as its own [[providers]] table (two brackets); "
                        "see config/analysis.example.toml.")
            raise ConfigError(f"{source}: {details}", hint=hint) from exc
        return attrs.evolve(config, source=source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Config:
        p = Path(path)
        try:
            with open_regular(p) as f:  # a FIFO would block, /dev/zero never end
                raw = f.read(MAX_CONFIG_BYTES + 1)
            if len(raw) > MAX_CONFIG_BYTES:
                raise ConfigError(f"{p}: larger than {MAX_CONFIG_BYTES} bytes, which no "
                                  "configuration needs")
            data = tomllib.loads(raw.decode("utf-8-sig"))  # a BOM, as editors write it, is no key
        except FileNotFoundError as exc:
            raise ConfigError(f"{p}: configuration file not found") from exc
        except NotRegularFile as exc:
            raise ConfigError(f"{p}: {exc.kind}, not a regular file",
                              hint="Pass --config a TOML file (see "
                                   "config/analysis.example.toml).") from exc
        except WouldWait as exc:
            raise ConfigError(f"{p}: cannot read configuration ({exc.strerror})",
                              hint="Pass --config a TOML file (see "
                                   "config/analysis.example.toml).") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{p}: cannot read configuration ({exc.__class__.__name__})") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p}: not valid TOML ({exc})") from exc
        except RecursionError as exc:  # tomllib recurses per nested array or table
            raise ConfigError(f"{p}: nested too deeply to be a configuration") from exc
        return cls.from_mapping(data, source=str(p))

    @classmethod
    def resolve(cls, explicit: str | None) -> Config:
        """``--config`` or ``VIANO_CONFIG``, else the local file if present, else defaults."""
        chosen = explicit or os.environ.get("VIANO_CONFIG")
        if chosen:
            return cls.load(chosen)
        if DEFAULT_CONFIG_PATH.is_file():
            return cls.load(DEFAULT_CONFIG_PATH)
        return cls.defaults()
