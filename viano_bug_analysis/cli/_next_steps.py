"""What a person does next after a result that is not the end of the road, by reason
code: one text for ``viano interpret``/``hypothesize``, the batch summary and the daemon."""

from __future__ import annotations

# What a person does next after a result that is not the end of the road.
_NEXT_STEP = {
    "locked": "another dispatch holds {case}; run the same command again once it is done",
    "stale_generation": "another writer moved {case} meanwhile; run the same command again",
    "not_due": "run it again after the due time, or let 'viano batch --wait' or "
               "'viano daemon' do it",
    "providers_unavailable": "nothing to fix if the outage is temporary: run again after "
                             "the due time, or let 'viano batch --wait' or 'viano daemon' "
                             "do it",
    "rounds_exhausted": "check the providers, then 'viano unblock {case}'",
    "calls_unrecorded": "find why the process stopped after its model calls (its log, its "
                        "exit status, memory), fix that, then run 'viano interpret {case}' "
                        "or 'viano hypothesize {case}' (the phase above) again",
    "awaiting_confirmation": "read it ('viano cat {case} <summary.md path>' or 'viano log "
                             "{case}'), then 'viano confirm {case}'",
    "invalid_answer": "see the errors file named above; ask again with a new --attempt-id",
    "provider_configuration": "fix the provider configuration (keys, base_url, model); "
                              "then run the same command again",
}


def next_step(reason: object, case: str) -> str | None:
    """The next step for ``reason`` (None when a result needs none), naming ``case``."""
    hint = _NEXT_STEP.get(str(reason))
    return None if hint is None else hint.format(case=case)
