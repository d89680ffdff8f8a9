"""What an LLM phase supplies to the shared runner (:class:`PhaseSpec`), and the shapes its
answers become: a :class:`Problem` per broken rule, or the :class:`Accepted` artifacts."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Protocol

import attrs

from .._canonical import artifact_json
from .._config import Config
from ._protocol import DispatchRequest, Refusal, phase_dir
from ._view import PackageView


@attrs.frozen
class Problem:
    """One reason an answer is rejected: the rule it breaks and where (a JSON pointer into
    the answer)."""

    rule: str
    pointer: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"rule": self.rule, "pointer": self.pointer, "message": self.message}


@attrs.frozen
class Accepted:
    """What a valid answer becomes: the artifacts, their pointers, and how the phase ends.
    ``more_work`` says whether the case has a next step a dispatch can take by itself (its
    durable status is then READY, so batch runs and the daemon pick it up; otherwise
    COMPLETED)."""

    files: Mapping[str, bytes]
    pointers: Mapping[str, str]
    reason: str                       # the COMPLETED result's reason code
    message: str
    more_work: bool = False


class PhaseSpec(Protocol):
    """What an LLM phase supplies to the shared runner."""

    @property
    def key(self) -> str:
        """The folder under ``analysis/`` and the prefix of the phase's pointers."""

    @property
    def phase(self) -> str:
        """The manifest phase while it runs (and after: it stays)."""

    @property
    def prompt_id(self) -> str: ...

    @property
    def pointer_prefix(self) -> str:
        """The prefix of the runner's pointers (``<prefix>_policy``, ``<prefix>_context``)."""

    def configured(self, config: Config) -> Mapping[str, Any]:
        """The phase's policy as ``config`` sets it (what a revision pins)."""

    def pinned_policy(self, value: Any) -> Mapping[str, Any] | None:
        """``value`` (read back from a package) rebuilt through the configuration's types:
        the policy a configuration could have pinned, or ``None`` if none could."""

    def policy(self, request: DispatchRequest) -> Mapping[str, Any]: ...
    def schema(self) -> Mapping[str, Any]: ...
    def max_output_bytes(self, policy: Mapping[str, Any]) -> int: ...
    def precheck(self, view: PackageView) -> Refusal | None: ...

    def context(self, view: PackageView, policy: Mapping[str, Any], revision: int
                ) -> bytes | Refusal:
        """The model's input for ``revision``: a pure function of the package's immutable
        files and the policy (derived again to check a pinned context)."""

    def artifacts(self, revision: int) -> Mapping[str, str]:
        """The accepted artifacts of ``revision``: pointer name -> path."""

    def accepted(self, view: PackageView, revision: int) -> bool:
        """Whether ``revision`` declares accepted artifacts (any of them)."""

    def origin_round(self, view: PackageView, revision: int) -> str | None:
        """The round whose answer the accepted artifacts say they come from."""

    def artifact_problems(self, view: PackageView, revision: int) -> list[str]:
        """Why the declared artifacts of ``revision`` are not what their origin gives."""

    def validate(self, answer: Any, view: PackageView) -> list[Problem]: ...
    def accept(self, answer: Any, view: PackageView, round_path: str,
               request: DispatchRequest) -> Accepted | Refusal: ...


def policy_bytes(spec: PhaseSpec, revision: int, policy: Mapping[str, Any]) -> bytes:
    return artifact_json({"format": f"viano-{spec.key}-policy/1", "phase": spec.phase,
                          "analysis_revision": revision, "policy": dict(policy)})


def paths(spec: PhaseSpec, revision: int) -> Mapping[str, str]:
    return _paths(spec.key, revision)


@functools.lru_cache(maxsize=1024)
def _paths(key: str, revision: int) -> Mapping[str, str]:
    base = phase_dir(key, revision)
    return MappingProxyType({"policy": f"{base}policy.json",
                             "context": f"{base}context.json"})


def strict_attrs(cls: type[Any], value: Any) -> Any:
    """``value`` (JSON read back from a package) as an instance of the attrs class ``cls``:
    exactly its fields, each of the type of its default (nested attrs classes recursively),
    through its validators; ``None`` if it is not one. No coercion: ``"5"`` is not 5, and
    ``true`` is not 1."""
    if not isinstance(value, dict):
        return None
    fields = attrs.fields(cls)
    if set(value) != {f.name for f in fields}:
        return None
    kwargs = {}
    for f in fields:
        factory = getattr(f.default, "factory", None)  # an attrs.Factory
        default = factory() if callable(factory) else f.default
        item = value[f.name]
        if attrs.has(type(default)):
            item = strict_attrs(type(default), item)
            if item is None:
                return None
        elif type(item) is not type(default):
            return None
        kwargs[f.name] = item
    try:
        return cls(**kwargs)
    except (TypeError, ValueError):
        return None
