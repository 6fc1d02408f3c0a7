"""The CURVE keys of ``--remote-status``: made by ``engramd keys DIR``, read by ``serve``.

    DIR/server.key, DIR/server.key_secret    the daemon's keypair
    DIR/client.key, DIR/client.key_secret    a monitoring client's keypair
    DIR/authorized/                          public keys allowed to connect (client.key is put there)

Whoever may add a file to ``authorized/`` may read the node's status over TCP, and whoever
may read a ``.key_secret`` may pose as its owner.  So both directories must belong to root or
to engramd's user and be writable by nobody else (a sticky directory does not do: others may
still add names), checked before a key is written or read; and each key file is written
whole, with its final mode from the start (0600 for a secret, 0644 for a public key), under a
fresh name created exclusively (O_EXCL, O_NOFOLLOW), then renamed to its own.  pyzmq's
``create_certificates`` writes with the umask's mode (0644) and a chmod after: another user
reading the file in between had the secret.

Owns the key files; the TCP socket that uses them is engramd/daemon/remote_status.py's.
"""
from __future__ import annotations

import datetime
import os
import secrets

import zmq
import zmq.auth

from engram_client.core.errors import EngramError

from .safe_paths import UnsafePathError, check_directory
from .whole_files import write_then_rename


class CurveConfigError(EngramError):
    code = "bad_config"


def check_keys_directory(path: str, what: str) -> None:
    """Raise CurveConfigError unless only root or engramd's user may add or replace files in ``path``."""
    try:
        check_directory(path, what, sticky_ok=False)
    except UnsafePathError as exc:
        raise CurveConfigError(str(exc)) from exc


def _make_directory(path: str, what: str) -> None:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise CurveConfigError(f"cannot create CURVE keys: {what} {path}: {exc.strerror}") from exc
    check_keys_directory(path, what)


def _key_text(public: bytes, secret: bytes | None) -> bytes:
    """The ZPL certificate zmq.auth.load_certificate reads (the layout pyzmq's create_certificates writes)."""
    kind = "secret" if secret is not None else "public"
    lines = [f"#   ****  CURVE {kind} key made by `engramd keys` on {datetime.datetime.now():%Y-%m-%d %H:%M}  ****",
             "#   ZeroMQ CURVE certificate (ZPL). Keep a secret key owner-only.", "", "metadata", "curve",
             f'    public-key = "{public.decode()}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    return ("\n".join(lines) + "\n").encode()


def _write_key(path: str, text: bytes, mode: int) -> None:
    temporary = f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    write_then_rename(temporary, path, text, CurveConfigError, mode=mode, durable=True)


def create_keys(directory: str) -> dict[str, str]:
    """Write a server and a client keypair, and authorize the client; returns the paths."""
    _make_directory(directory, "keys directory")
    authorized = os.path.join(directory, "authorized")
    _make_directory(authorized, "authorized-keys directory")
    paths = {"authorized": authorized}
    for name in ("server", "client"):
        public, secret = zmq.curve_keypair()
        paths[f"{name}_secret"] = os.path.join(directory, f"{name}.key_secret")
        paths[f"{name}_public"] = os.path.join(directory, f"{name}.key")
        _write_key(paths[f"{name}_secret"], _key_text(public, secret), 0o600)
        _write_key(paths[f"{name}_public"], _key_text(public, None), 0o644)
        if name == "client":
            _write_key(os.path.join(authorized, "client.key"), _key_text(public, None), 0o644)
    return paths


def load_keypair(path: str) -> tuple[bytes, bytes]:
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise CurveConfigError(f"cannot read CURVE key {path}: {exc}") from exc
    if secret is None:
        raise CurveConfigError(f"{path} holds no secret key (use the .key_secret file)")
    return public, secret


def server_keys(keys_dir: str) -> tuple[str, bytes, bytes]:
    """(the authorized-keys directory, the server's public and secret key) of ``keys_dir``,
    once both directories are found to be only root's or engramd's user's to change."""
    check_keys_directory(keys_dir, "--curve-keys-dir")
    authorized = os.path.join(keys_dir, "authorized")
    if not os.path.lexists(authorized):
        raise CurveConfigError(f"no authorized client keys in {authorized}; run `engramd keys {keys_dir}`")
    check_keys_directory(authorized, "authorized-keys directory")
    if not os.listdir(authorized):
        raise CurveConfigError(f"no authorized client keys in {authorized}; run `engramd keys {keys_dir}`")
    public, secret = load_keypair(os.path.join(keys_dir, "server.key_secret"))
    return authorized, public, secret
