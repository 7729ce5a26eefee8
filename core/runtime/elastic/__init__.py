"""Elastic training, the rank's side and the protocol: Horovod's ``State``, ``ObjectState``, ``run``; kept on each host's tmpfs.

Under ``ddlrun --elastic`` a lost host ends the world it was in, and ``ddlrun`` starts the
next world on the hosts that remain (and those that join); the state object carries the
training across (see ``docs/guides/elastic.md``). The modules:

- :mod:`~ddl.runtime.elastic.protocol`: every message between ``ddlrun``, the host
  agents, the stubs and the ranks, typed and versioned;
- :mod:`~ddl.runtime.elastic.wire`: how they travel (JSON lines, descriptors, socket paths);
- :mod:`~ddl.runtime.elastic.link`: this rank's connection to its host's agent;
- :mod:`~ddl.runtime.elastic.state`: ``State`` and ``ObjectState`` (commit, restore, sync);
- :mod:`~ddl.runtime.elastic.store`: a host's last commit on tmpfs;
- :mod:`~ddl.runtime.elastic.shards`: sharded state (ZeRO-1) gathered to each host's commit, re-split at sync;
- :mod:`~ddl.runtime.elastic.position`: ``DataPosition``, where the world stands in its data;
- :mod:`~ddl.runtime.elastic.run_wrapper`: ``run``, and how a rank leaves its world.

The public names load on first use: the stub and the agent import the protocol without
numpy or MPI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddl.base.lazy import attributes

_LAZY: dict[str, str] = {
    "State": "ddl.runtime.elastic.state", "ObjectState": "ddl.runtime.elastic.state",
    "run": "ddl.runtime.elastic.run_wrapper",
    "AgentLink": "ddl.runtime.elastic.link", "agent_link": "ddl.runtime.elastic.link",
    "updates_pending": "ddl.runtime.elastic.link", "wait_for_host_updates": "ddl.runtime.elastic.link",
    "world_number": "ddl.runtime.elastic.link",
    "DataPosition": "ddl.runtime.elastic.position",
}

if TYPE_CHECKING:
    from ddl.runtime.elastic.link import (
        AgentLink,
        agent_link,
        updates_pending,
        wait_for_host_updates,
        world_number,
    )
    from ddl.runtime.elastic.position import DataPosition
    from ddl.runtime.elastic.run_wrapper import run
    from ddl.runtime.elastic.state import ObjectState, State


__getattr__ = attributes("ddl.runtime.elastic", _LAZY, globals())


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = ["AgentLink", "DataPosition", "ObjectState", "State", "agent_link", "run", "updates_pending",
           "wait_for_host_updates", "world_number"]
