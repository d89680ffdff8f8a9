"""Viano's trio actors: the publisher today; the case actor, gateway pool and supervisor
land with their phases. Imports only from ``engine``'s face."""

from ._publisher import PublisherStats as PublisherStats
from ._publisher import PublishMsg as PublishMsg
from ._publisher import mailbox as mailbox
from ._publisher import run_publisher as run_publisher
from ._store_handle import StoreHandle as StoreHandle
from ._store_handle import open_store as open_store
