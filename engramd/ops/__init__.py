"""One module per operation; each holds the operation's whole daemon-side contract.

An operation is a class with ``name`` and ``execute(daemon, args) -> result``.
Handlers validate their own arguments and raise from the one exception tree; the
server maps exceptions to error replies in one place.  Tests call ``execute``
directly, without sockets.
"""
from __future__ import annotations

from .attach import Attach
from .detach import Detach
from .heartbeat import Heartbeat
from .reload import Reload
from .status import Status
from .stop import Stop

OPERATIONS = {op.name: op for op in (Attach(), Heartbeat(), Detach(), Status(), Stop(), Reload())}
