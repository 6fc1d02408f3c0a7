"""One module per operation; each holds the operation's whole daemon-side contract.

An operation is a class with ``name`` and ``execute(daemon, args) -> result``.
Handlers validate their own arguments and raise from the one exception tree; the
server maps exceptions to error replies in one place.  Tests call ``execute``
directly, without sockets.

Must not import: ``engramd.daemon.state_machine``, ``engramd.daemon.server`` (a handler is given
the daemon; it never reaches for one).
"""
from __future__ import annotations

from engram_client.core import protocol

from .attach import Attach
from .detach import Detach
from .heartbeat import Heartbeat
from .reload import Reload
from .status import Status
from .stop import Stop

_HANDLERS = {op.name: op for op in (Attach(), Heartbeat(), Detach(), Status(), Stop(), Reload())}
if set(_HANDLERS) != set(protocol.OPERATIONS):  # the protocol's list is the one source of operation names
    raise ImportError(f"operation handlers {sorted(_HANDLERS)} do not match the protocol's {protocol.OPERATIONS}")
OPERATIONS = {name: _HANDLERS[name] for name in protocol.OPERATIONS}
