"""engram_client: map engramd's shared Engram table and look rows up, on CPU or GPU.

The public API is what this module exports; tests pin it.  Names that need torch are
imported on first use, so the daemon and light tools that only speak the protocol
(``engram_client.core``, ``engram_client.attach.connection``) never pay for torch.
"""
from .core.errors import (CheckpointError, CudaRegistrationError, DaemonUnavailableError, EngramError,
                     EngramTimeoutError, IdsOutOfRangeError, LayoutError, NotAttachedError, NotCapturableError,
                     NotReadyError, ConfigError,
                     ProtocolError, RequestError, ShmSpaceError, TableFileError, UnknownClientError,
                     UnknownLayerError)
from .core.errors import HasherUnavailableError, HotListError, IntegrationError, SocketRefusedError, TokenIdsError
from .core.endpoints import default_endpoint
from .core.protocol import PROTOCOL_VERSION
from .core.version import __version__

__all__ = [
    "EngramClient", "EngramTable", "PrefetchHandle", "PROTOCOL_VERSION", "default_endpoint", "__version__",
    "EngramError", "CheckpointError", "LayoutError", "TableFileError", "ShmSpaceError", "ProtocolError",
    "RequestError", "NotReadyError", "UnknownClientError", "DaemonUnavailableError", "EngramTimeoutError",
    "NotAttachedError", "CudaRegistrationError", "IdsOutOfRangeError", "NotCapturableError", "ConfigError",
    "UnknownLayerError", "TokenIdsError", "HasherUnavailableError", "SocketRefusedError",
    "IntegrationError", "HotListError",
]
_LAZY = {"EngramClient": ".client", "EngramTable": ".lookup.table", "PrefetchHandle": ".lookup.prefetch"}


def __getattr__(name: str):
    if name in _LAZY:
        from importlib import import_module
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
