"""engram_client's public API, pinned: a change here is a change for every rank that imports it."""
from __future__ import annotations

import importlib.metadata
import inspect

import engram_client
from engram_client.core import errors

EXPECTED_ALL = [
    "EngramClient", "EngramTable", "PrefetchHandle", "PROTOCOL_VERSION", "default_endpoint", "__version__",
    "EngramError", "CheckpointError", "LayoutError", "TableFileError", "ShmSpaceError", "ProtocolError",
    "RequestError", "NotReadyError", "UnknownClientError", "DaemonUnavailableError", "EngramTimeoutError",
    "NotAttachedError", "CudaRegistrationError", "IdsOutOfRangeError", "NotCapturableError", "ConfigError",
    "UnknownLayerError", "TokenIdsError", "HasherUnavailableError", "SocketRefusedError",
    "IntegrationError", "HotListError",
]


def error_classes() -> dict[str, type]:
    return {name: obj for name, obj in vars(errors).items()
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__}


def test_all_is_pinned():
    assert len(engram_client.__all__) == len(set(engram_client.__all__)), "__all__ repeats a name"
    assert sorted(engram_client.__all__) == sorted(EXPECTED_ALL)


def test_every_public_name_resolves():
    for name in EXPECTED_ALL:
        assert getattr(engram_client, name, None) is not None, name
    namespace: dict = {}
    exec("from engram_client import *", namespace)
    assert set(EXPECTED_ALL) <= set(namespace)
    assert engram_client.PROTOCOL_VERSION == (1, 10)
    assert callable(engram_client.default_endpoint)
    for name in ("EngramClient", "EngramTable", "PrefetchHandle"):
        assert inspect.isclass(getattr(engram_client, name)), name


def test_version_matches_the_installed_distribution():
    assert engram_client.__version__ == importlib.metadata.version("engramd")


def test_every_error_derives_from_engram_error_and_is_exported():
    classes = error_classes()
    assert len(classes) == 22, sorted(classes)
    for name, cls in classes.items():
        assert issubclass(cls, errors.EngramError), name
        assert name in engram_client.__all__, f"{name} is in engram_client.core.errors but not exported"
        assert getattr(engram_client, name) is cls
    codes = [cls.code for cls in classes.values()]
    assert len(codes) == len(set(codes)), f"two error classes share a code: {sorted(codes)}"


def test_error_codes_match_the_protocol_document():
    # docs/protocol.md's table of error codes
    assert errors.ProtocolError.code == "bad_request"
    assert errors.NotReadyError.code == "not_ready"
    assert errors.UnknownClientError.code == "unknown_client"
    assert errors.EngramError.code == "internal"


def test_timeouts_and_range_errors_are_also_builtin_kinds():
    assert issubclass(errors.EngramTimeoutError, TimeoutError)
    assert issubclass(errors.IdsOutOfRangeError, IndexError)
    assert issubclass(errors.UnknownLayerError, KeyError)


def test_unknown_layer_error_reads_plainly_unlike_a_bare_key_error():
    message = "layer 2 is not in this table (layers [1, 14])"
    assert str(errors.UnknownLayerError(message)) == message
    assert str(KeyError(message)) != message  # what a bare KeyError would have shown


def test_reply_error_map_names_request_error_subclasses():
    assert errors.REPLY_ERRORS, "no error reply maps back to its class"
    for name, cls in errors.REPLY_ERRORS.items():
        assert inspect.isclass(cls) and issubclass(cls, errors.RequestError), name
        assert cls is not errors.RequestError
        assert cls.__name__ == name
    request_errors = {cls for cls in error_classes().values()
                      if issubclass(cls, errors.RequestError) and cls is not errors.RequestError}
    assert set(errors.REPLY_ERRORS.values()) == request_errors


def test_request_error_carries_the_reply_code_and_name():
    exc = errors.NotReadyError("refused", code="not_ready", name="NotReadyError")
    assert exc.code == "not_ready" and exc.name == "NotReadyError" and str(exc) == "refused"
    generic = errors.RequestError("boom", code="internal", name="KeyError")
    assert generic.code == "internal" and generic.name == "KeyError"
    assert errors.UnknownClientError("x").name == "UnknownClientError"
