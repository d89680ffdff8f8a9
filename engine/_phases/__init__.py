"""The LLM phases: the durable protocol they share, interpretation and hypotheses."""

from collections.abc import Sequence

from .._store import PackageCheck

PHASE_CHECKS: Sequence[PackageCheck] = ()
