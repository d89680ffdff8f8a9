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
    "attempt_rejected": "this attempt was rejected under these inputs and is never asked "
                        "again; ask anew with a new --attempt-id",
    "policy_changed": "restore the configuration this revision pinned and run the same "
                      "command again, or 'viano reopen {case} --reason TEXT' to start a "
                      "revision that pins the new one (interpreted and confirmed anew)",
    "interpretation_not_confirmed": "without an interpretation yet, 'viano interpret {case}' "
                                    "first; then read it ('viano report {case}') and "
                                    "'viano confirm {case}'",
    "unsupported_history": "'viano verify {case}' names what of its history this version "
                           "did not write",
    # Raised in the configuration, a limit the revision has not pinned yet takes effect at
    # once; one it pinned makes the next run policy_changed, whose step is a reopen.
    "limit_exceeded": "raise the limit the message names ([interpretation.limits] or "
                      "[hypotheses.limits]), then run the same command again",
    "internal_error": "a bug in Viano; what was committed is kept: run the same command "
                      "again, and if it repeats, report it with this message",
    "interpretation_mismatch": "'viano verify {case}' names what no longer matches the "
                               "case; 'viano reopen {case} --reason TEXT' starts a revision "
                               "interpreted and confirmed anew",
    "missing_observations": "read it ('viano report {case}'): 'viano reopen {case} --reason "
                            "TEXT' has it interpreted anew, or, when the report lacks them, "
                            "take it in again with the observations as a new case ('viano "
                            "intake --report FILE --case-id NEW')",
    # A store's error on reading the case. Under batch and the daemon the ERROR is
    # recorded, so '--all' skips the case until it is taken up by id (as the lines of
    # many cases say).
    "store_corrupt": "'viano verify {case}' names what is damaged; restore the store from "
                     "its backup, then run the same command again",
    "store_unavailable": "the store could not be read (its disk, permissions or database): "
                         "fix that, then run the same command again",
}

# The same for the lines of many cases (batch, run, daemon), which show neither the phase,
# nor the files named in a single result's message, and which have no --attempt-id; and
# whose '--all' never takes an ERROR case up again (only its id does).
_MANY_NEXT_STEP = _NEXT_STEP | {
    "provider_configuration": "fix the provider configuration (keys, base_url, model), "
                              "then 'viano batch {case}' (by id: 'viano batch --all' and "
                              "the daemon do not take an ERROR case up again)",
    "invalid_answer": "read why ('viano log {case}' names the errors file), then ask again "
                      "with a new attempt: 'viano interpret {case} --attempt-id NEW' or "
                      "'viano hypothesize {case} --attempt-id NEW', for its phase",
    "calls_unrecorded": "find why the process stopped after its model calls (its log, its "
                        "exit status, memory), fix that, then 'viano interpret {case}' or "
                        "'viano hypothesize {case}', for its phase ('viano status')",
    "awaiting_confirmation": "read it ('viano report {case}'), then 'viano confirm {case}'",
    "policy_changed": "restore the configuration this revision pinned, then 'viano batch "
                      "{case}' (by id, as for any ERROR case); or 'viano reopen {case} "
                      "--reason TEXT' to start a revision that pins the new one (interpreted "
                      "and confirmed anew)",
    "limit_exceeded": "raise the limit it passed in [interpretation.limits] or "
                      "[hypotheses.limits] ('viano batch {case} --json' prints the message "
                      "that names it), then 'viano batch {case}' (by id, as for any ERROR "
                      "case)",
    "internal_error": "a bug in Viano; what was committed is kept: 'viano batch {case}' "
                      "again, and if it repeats, report it with the case's log ('viano log "
                      "{case}')",
    "attempt_rejected": "this attempt was rejected under these inputs and is never asked "
                        "again; ask anew: 'viano interpret {case} --attempt-id NEW' or "
                        "'viano hypothesize {case} --attempt-id NEW', for its phase",
    "store_corrupt": "'viano verify {case}' names what is damaged; restore the store from "
                     "its backup, then 'viano batch {case}'",
    "store_unavailable": "the store could not be read (its disk, permissions or database): "
                         "fix that, then 'viano batch {case}'",
}


def next_step(reason: object, case: str, *, many: bool = False) -> str | None:
    """The next step for ``reason`` (None when a result needs none), naming ``case``;
    ``many``: as said on the lines of a command over many cases."""
    hint = (_MANY_NEXT_STEP if many else _NEXT_STEP).get(str(reason))
    return None if hint is None else hint.format(case=case)
