"""Viano's public face for embedding: open a store and a gateway, intake cases, run rounds.

    async with open_store("viano-store") as store, open_gateway(config.providers,
                                                                config.gateway) as gateway:
        published = await store.intake(prepare_intake(report, attachments, case_id=None,
                                                      limits=config.intake.limits))
        outcome = await gateway.round(RoundRequest(Prompt(...)))

The hypothesis phase's ``analysis`` module (``HypothesisBuilder``, ``HypothesisConfig``)
lands with that phase.
"""

from actors import GatewayHandle as GatewayHandle
from actors import StoreHandle as StoreHandle
from actors import open_gateway as open_gateway
from actors import open_store as open_store
from engine import Attachment as Attachment
from engine import AuditRecord as AuditRecord
from engine import Config as Config
from engine import FailureClass as FailureClass
from engine import IntakePlan as IntakePlan
from engine import Prompt as Prompt
from engine import Published as Published
from engine import RoundOutcome as RoundOutcome
from engine import RoundRequest as RoundRequest
from engine import RoundStatus as RoundStatus
from engine import VianoError as VianoError
from engine import prepare_intake as prepare_intake
from engine import verify_store as verify_store
