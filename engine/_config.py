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

import attrs
import cattrs

from ._errors import ConfigError
from ._store._sources import NotRegularFile, open_regular
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


def _positive(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    _finite(attribute, value)
    if not value > 0:
        raise ValueError(f"{attribute.name} must be positive, got {value}")


def _non_negative(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    _finite(attribute, value)
    if not value >= 0:
        raise ValueError(f"{attribute.name} must not be negative, got {value}")


def _lease(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """A lease is renewed every lease_s / 3 and a dead worker's cases wait lease_s: under
    1 s renewals would flood the database, over a day a crash would stall its cases."""
    _finite(attribute, value)
    if not 1 <= value <= 86400:
        raise ValueError(f"{attribute.name} must be from 1 to 86400 seconds, got {value}")


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def _env_name(_inst: Any, attribute: attrs.Attribute[Any], value: str | None) -> None:
    """A variable's name, never its value: a pasted key is refused without being echoed."""
    if value is not None and _ENV_NAME.fullmatch(value) is None:
        raise ValueError(f"{attribute.name} must be the name of an environment variable "
                         "(letters, digits and '_', not starting with a digit); the value "
                         "given is not shown, in case it is a key")


@attrs.frozen
class HypothesisLimits:
    max_context_bytes: int = attrs.field(default=1_048_576, validator=_positive)
    max_prior_generations: int = attrs.field(default=32, validator=_positive)
    max_output_bytes: int = attrs.field(default=2_097_152, validator=_positive)
    max_summary_bytes: int = attrs.field(default=2_097_152, validator=_positive)


@attrs.frozen
class HypothesisPolicy:
    min_hypotheses: int = attrs.field(default=3, validator=_positive)
    max_hypotheses: int = attrs.field(default=5, validator=_positive)
    initial_budget: int = attrs.field(default=100, validator=_positive)
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

    max_context_bytes: int = attrs.field(default=1_048_576, validator=_positive)
    max_excerpt_bytes: int = attrs.field(default=8_192, validator=_positive)
    max_excerpts_total_bytes: int = attrs.field(default=262_144, validator=_positive)
    max_output_bytes: int = attrs.field(default=2_097_152, validator=_positive)
    max_summary_bytes: int = attrs.field(default=2_097_152, validator=_positive)


@attrs.frozen
class InterpretationPolicy:
    auto_confirm: bool = False
    limits: InterpretationLimits = attrs.field(factory=InterpretationLimits)


@attrs.frozen
class RetryPolicy:
    max_rounds: int = attrs.field(default=10, validator=_positive)
    base_delay_s: float = attrs.field(default=30.0, validator=_positive)
    max_delay_s: float = attrs.field(default=3600.0, validator=_positive)

    def __attrs_post_init__(self) -> None:
        if self.base_delay_s > self.max_delay_s:
            raise ValueError(f"base_delay_s ({self.base_delay_s}) exceeds "
                             f"max_delay_s ({self.max_delay_s})")


@attrs.frozen
class IntakeLimits:
    """Limits applied to every archive read (intake and import)."""

    max_members: int = attrs.field(default=20_000, validator=_positive)
    max_member_bytes: int = attrs.field(default=268_435_456, validator=_positive)
    max_total_bytes: int = attrs.field(default=1_073_741_824, validator=_positive)
    max_compression_ratio: float = attrs.field(default=200.0, validator=_positive)
    max_report_bytes: int = attrs.field(default=16_777_216, validator=_positive)

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
    timeout_s: float = attrs.field(default=120.0, validator=_positive)
    retries: int = attrs.field(default=2, validator=_non_negative)
    max_concurrency: int = attrs.field(default=8, validator=_positive)

    def __attrs_post_init__(self) -> None:
        if not self.name.strip():
            raise ValueError("name must not be blank")
        if self.kind == "fixture" and not self.path:
            raise ValueError(f"provider {self.name!r} of kind 'fixture' needs 'path'")
        if self.kind != "fixture" and not (self.base_url and self.model):
            raise ValueError(f"provider {self.name!r} of kind {self.kind!r} needs "
                             "'base_url' and 'model'")


@attrs.frozen
class GatewayConfig:
    """How the gateway retries within a round (the round itself is never slept across)."""

    connect_timeout_s: float = attrs.field(default=10.0, validator=_positive)
    backoff_base_s: float = attrs.field(default=0.5, validator=_positive)
    backoff_max_s: float = attrs.field(default=8.0, validator=_positive)
    retry_after_cap_s: float = attrs.field(default=30.0, validator=_non_negative)
    cooldown_after: int = attrs.field(default=3, validator=_positive)
    cooldown_s: float = attrs.field(default=60.0, validator=_non_negative)
    max_connections: int = attrs.field(default=16, validator=_positive)
    max_output_bytes: int = attrs.field(default=2_097_152, validator=_positive)


@attrs.frozen
class StoreConfig:
    """``[store]``: where the store lives. ``--store``/``VIANO_STORE`` override ``url``."""

    url: str | None = None
    blob_root: str | None = None
    lease_s: float = attrs.field(default=30.0, validator=_lease)


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
            raise ConfigError(f"{source}: {details}") from exc
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
            data = tomllib.loads(raw.decode("utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError(f"{p}: configuration file not found") from exc
        except NotRegularFile as exc:
            raise ConfigError(f"{p}: {exc.kind}, not a regular file",
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
