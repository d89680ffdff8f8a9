"""Viano's trio actors: the publisher, the gateway pool, the case actor and the
supervisor. Imports only from ``engine``."""

from ._case_actor import Clock as Clock
from ._case_actor import PhaseServices as PhaseServices
from ._case_actor import SystemClock as SystemClock
from ._case_actor import TrioClock as TrioClock
from ._case_actor import case_operation as case_operation
from ._case_actor import dispatch_phase as dispatch_phase
from ._case_actor import log_event as log_event
from ._case_actor import run_phase as run_phase
from ._gateway_pool import GatewayHandle as GatewayHandle
from ._gateway_pool import GatewayPool as GatewayPool
from ._gateway_pool import ProviderStats as ProviderStats
from ._gateway_pool import open_gateway as open_gateway
from ._gateway_pool import run_gateway_pool as run_gateway_pool
from ._publisher import PublisherStats as PublisherStats
from ._publisher import PublishMsg as PublishMsg
from ._publisher import mailbox as mailbox
from ._publisher import run_publisher as run_publisher
from ._store_handle import Snapshot as Snapshot
from ._store_handle import StoreHandle as StoreHandle
from ._store_handle import open_store as open_store
from ._supervisor import CaseResult as CaseResult
from ._supervisor import Engine as Engine
from ._supervisor import check_concurrency as check_concurrency
from ._supervisor import open_engine_on as open_engine_on
from ._supervisor import worst_exit as worst_exit
