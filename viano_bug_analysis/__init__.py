"""Viano's public face for embedding: everything a host needs, without reaching into
``engine`` or ``actors``.

    async with open_gateway(config.providers, config.gateway) as gateway, \\
            open_store("viano-store") as store:
        published = await store.intake(prepare_intake(report, attachments, case_id=None,
                                                      limits=config.intake.limits))
        outcome = await gateway.round(RoundRequest(Prompt(...)))

The store is opened last so that it closes first: its publisher drains every queued
commit before the gateway's HTTP clients close.
"""

from actors import CaseResult as CaseResult
from actors import Engine as Engine
from actors import GatewayHandle as GatewayHandle
from actors import ProviderStats as ProviderStats
from actors import Snapshot as Snapshot
from actors import StoreHandle as StoreHandle
from actors import open_gateway as open_gateway
from actors import open_store as open_store
from engine import ArchiveRejected as ArchiveRejected
from engine import Attachment as Attachment
from engine import AuditRecord as AuditRecord
from engine import CaseExists as CaseExists
from engine import CaseLocked as CaseLocked
from engine import CaseStatus as CaseStatus
from engine import Change as Change
from engine import Config as Config
from engine import ConfigError as ConfigError
from engine import DispatchResult as DispatchResult
from engine import FailureClass as FailureClass
from engine import GatewayCancelled as GatewayCancelled
from engine import GatewayConfig as GatewayConfig
from engine import GatewayError as GatewayError
from engine import HistoryConflict as HistoryConflict
from engine import HypothesisLimits as HypothesisLimits
from engine import HypothesisPolicy as HypothesisPolicy
from engine import IntakeLimits as IntakeLimits
from engine import IntakePlan as IntakePlan
from engine import InterpretationPolicy as InterpretationPolicy
from engine import Manifest as Manifest
from engine import NotFound as NotFound
from engine import Prompt as Prompt
from engine import ProviderConfig as ProviderConfig
from engine import Published as Published
from engine import RejectedInput as RejectedInput
from engine import RetryPolicy as RetryPolicy
from engine import RoundOutcome as RoundOutcome
from engine import RoundRequest as RoundRequest
from engine import RoundStatus as RoundStatus
from engine import Shard as Shard
from engine import StaleGeneration as StaleGeneration
from engine import StorageError as StorageError
from engine import VianoError as VianoError
from engine import prepare_intake as prepare_intake

from ._engine import open_engine as open_engine
from ._sample import bundled_sample as bundled_sample
