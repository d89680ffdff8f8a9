"""Provider adapters, wire formats, failure classes, redaction and audit records.

Plain async functions over httpx; the gateway-pool actor in ``actors`` owns the clients,
limiters, cooldowns, deadlines and sleeps.
"""

from ._answer import InvalidAnswer as InvalidAnswer
from ._answer import parse_contracted_json as parse_contracted_json
from ._attempt import AttemptContext as AttemptContext
from ._attempt import AttemptResult as AttemptResult
from ._attempt import fixture_attempt as fixture_attempt
from ._attempt import http_attempt as http_attempt
from ._attempt import make_record as make_record
from ._audit import AuditRecord as AuditRecord
from ._classes import FailureClass as FailureClass
from ._classes import classify_exception as classify_exception
from ._classes import classify_status as classify_status
from ._redact import MASK as MASK
from ._redact import Redactor as Redactor
from ._redact import install_log_filter as install_log_filter
from ._redact import remove_log_filter as remove_log_filter
from ._retry import backoff_delay as backoff_delay
from ._retry import doubled as doubled
from ._retry import retry_after_seconds as retry_after_seconds
from ._round import RoundOutcome as RoundOutcome
from ._round import RoundRequest as RoundRequest
from ._round import RoundStatus as RoundStatus
from ._round import no_answer_status as no_answer_status
from ._wire import HttpCall as HttpCall
from ._wire import Prompt as Prompt
from ._wire import build_call as build_call
from ._wire import extract_content as extract_content
