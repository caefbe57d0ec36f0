"""The collect coordinator (DESIGN §3, §6): gRPC service, slot scheduler, CPU collective executor,
context switching, graph assembly.
"""

from .collect import CollectOptions, CollectProgress, CollectResult, collect_job
from .executor import Arrival, execute, execute_p2p

__all__ = ["CollectOptions", "CollectProgress", "CollectResult", "collect_job", "Arrival", "execute", "execute_p2p"]
