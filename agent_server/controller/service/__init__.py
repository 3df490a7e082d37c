"""`agent-server pool serve`: the pool as a running service (`docs/pool-service.md`).

A JSON API over the walk (turns, the pool, assignments, stops, clears), its events as
server-sent events, Prometheus metrics, the agents' heartbeats, and a page; it runs
the waiting turns' retries and the gateway's switch-backs itself. Several instances
on one store serve one pool; what must run once is claimed in the store.
"""

from agent_server.controller.service.app import create_app, route_table
from agent_server.controller.service.instance import ServiceConfig, ServiceInstance

__all__ = ["ServiceConfig", "ServiceInstance", "create_app", "route_table"]
