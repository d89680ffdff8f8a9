"""A real HTTP/1.1 provider server on loopback (trio + h11) for tests and benchmarks."""

from .server import DEFAULT_ANSWER as DEFAULT_ANSWER
from .server import MODES as MODES
from .server import LoopbackServer as LoopbackServer
from .server import dead_port as dead_port
