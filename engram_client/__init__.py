"""engram_client: map engramd's shared Engram table and look rows up, on CPU or GPU.

The public API is what this module exports; tests pin it.
"""
from .client import EngramClient
from .errors import (CheckpointError, CudaRegistrationError, DaemonUnavailableError, EngramError,
                     EngramTimeoutError, IdsOutOfRangeError, LayoutError, NotAttachedError, NotReadyError,
                     ProtocolError, RequestError, ShmSpaceError, TableFileError, UnknownClientError)
from .prefetch import PrefetchHandle
from .protocol import PROTOCOL_VERSION, default_endpoint
from .table import EngramTable

__version__ = "0.1.0"
__all__ = [
    "EngramClient", "EngramTable", "PrefetchHandle", "PROTOCOL_VERSION", "default_endpoint", "__version__",
    "EngramError", "CheckpointError", "LayoutError", "TableFileError", "ShmSpaceError", "ProtocolError",
    "RequestError", "NotReadyError", "UnknownClientError", "DaemonUnavailableError", "EngramTimeoutError",
    "NotAttachedError", "CudaRegistrationError", "IdsOutOfRangeError",
]
