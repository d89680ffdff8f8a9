"""Intake: report parsing, safe archive reading, the canonical catalogue."""

from ._archives import MemberInfo as MemberInfo
from ._archives import archive_kind as archive_kind
from ._archives import member_heads as member_heads
from ._archives import scan_archive as scan_archive
from ._catalogue import media_type as media_type
from ._formats import FORMATS as FORMATS
from ._formats import parse_report as parse_report
from ._intake import INTAKE_PHASE as INTAKE_PHASE
from ._intake import ROLES as ROLES
from ._intake import Attachment as Attachment
from ._intake import IntakePlan as IntakePlan
from ._intake import check_regular as check_regular
from ._intake import prepare_intake as prepare_intake
from ._intake import unreadable as unreadable
from ._jira import converted as converted
from ._report import Report as Report
from ._report import TextSource as TextSource
