"""The one exception tree shared by the daemon, the CLI and the client library.

    EngramError                      base of everything raised on purpose
    ├── CheckpointError              a checkpoint that cannot be loaded (names file and tensor)
    ├── LayoutError                  config and tensors disagree, or a config is unusable
    ├── TableFileError               a table file that is not complete, not ours, or damaged
    ├── ShmSpaceError                not enough room in the shm dir to reserve the table
    ├── ConfigError                  a setting (the daemon's or a client's) that cannot work (names it)
    ├── ProtocolError                a message that does not follow docs/protocol.md
    ├── RequestError                 the daemon answered a request with an error reply
    │   ├── NotReadyError            no table is ready yet (state loading / failed)
    │   └── UnknownClientError       the lease is unknown (expired, or a new daemon)
    ├── DaemonUnavailableError       the daemon did not answer in time, or is gone
    │   └── SocketRefusedError       its socket is one this user may not, or must not, talk through
    ├── EngramTimeoutError           a wait ran out; the message says what it waited for
    ├── NotAttachedError             the client is closed or was never attached
    ├── CudaRegistrationError        cudaHostRegister or a related runtime call failed
    ├── NotCapturableError           a lookup started while a CUDA graph is being captured
    ├── IdsOutOfRangeError           lookup ids outside the table's (registered) rows
    ├── UnknownLayerError            ``client.table(layer)`` for a layer the table lacks, or not an int
    ├── TokenIdsError                token ids the hasher cannot hash (dtype, shape, range)
    ├── HasherUnavailableError       the served table has no token map to hash with
    ├── HotListError                 a hot-row list that is damaged, or built for another table
    └── IntegrationError             an engine integration that cannot serve what the engine asks
                                     (its version, its layout, its weights; names what and where)

Each side maps lower-layer exceptions to these in one place and chains them with
``raise ... from exc``.  Error replies carry ``name`` so the client can raise the
same class the daemon raised.
"""
from __future__ import annotations


class EngramError(Exception):
    """Base of every error engramd and engram_client raise on purpose."""

    code = "internal"


class CheckpointError(EngramError):
    code = "bad_checkpoint"


class LayoutError(EngramError):
    code = "bad_layout"


class TableFileError(EngramError):
    code = "bad_table_file"


class ShmSpaceError(EngramError):
    code = "shm_space"


class ConfigError(EngramError):
    code = "bad_config"


class ProtocolError(EngramError):
    code = "bad_request"


class RequestError(EngramError):
    """The daemon answered with an error reply; ``code`` and ``name`` come from it."""

    code = "request_failed"

    def __init__(self, message: str, code: str | None = None, name: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.name = name or type(self).__name__


class NotReadyError(RequestError):
    code = "not_ready"


class UnknownClientError(RequestError):
    code = "unknown_client"


class DaemonUnavailableError(EngramError):
    code = "unavailable"


class SocketRefusedError(DaemonUnavailableError):
    """Permission denied on the socket or its directory, or a socket another user could be posing
    through: no waiting mends it, and it says nothing about whether a daemon is there."""

    code = "socket_refused"


class EngramTimeoutError(EngramError, TimeoutError):
    code = "timeout"


class NotAttachedError(EngramError):
    code = "not_attached"


class CudaRegistrationError(EngramError):
    code = "cuda_registration"


class NotCapturableError(EngramError):
    code = "not_capturable"


class IdsOutOfRangeError(EngramError, IndexError):
    code = "ids_out_of_range"


class UnknownLayerError(EngramError, KeyError):
    """Also a KeyError, as a missing key of ``client.table`` is; its message reads plainly."""

    code = "unknown_layer"

    def __str__(self) -> str:  # KeyError would quote the message as if it were the key
        return str(self.args[0]) if self.args else ""


class TokenIdsError(EngramError, ValueError):
    code = "bad_token_ids"


class HasherUnavailableError(EngramError):
    code = "hasher_unavailable"


class HotListError(EngramError):
    """A hot-row list (hot_list.py) that cannot be read, or that does not fit the table it is served with."""

    code = "bad_hot_list"


class IntegrationError(EngramError):
    """An engine integration (engram_client.integrations) refuses: raised where the engine would
    otherwise have loaded a table of its own or served rows engramd does not hold."""

    code = "integration"


# Error replies name the class; the client turns the name back into the class.
REPLY_ERRORS: dict[str, type[RequestError]] = {
    "NotReadyError": NotReadyError,
    "UnknownClientError": UnknownClientError,
}
