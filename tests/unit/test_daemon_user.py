"""ENGRAMD_DAEMON_USER: the one user besides root and itself whose socket and table a client trusts."""
from __future__ import annotations

import pwd

import pytest

from engram_client.attach.socket_trust import DAEMON_USER_ENV, DEFAULT_DAEMON_USER, named_daemon_uid
from engram_client.core.errors import SocketRefusedError


def test_a_uid_or_a_user_name_names_the_daemons_user(monkeypatch):
    monkeypatch.setenv(DAEMON_USER_ENV, "4242")
    assert named_daemon_uid() == 4242
    monkeypatch.setenv(DAEMON_USER_ENV, " root ")
    assert named_daemon_uid() == 0


def test_a_name_no_user_has_is_refused_in_words(monkeypatch):
    monkeypatch.setenv(DAEMON_USER_ENV, "no-such-user-xyz")
    with pytest.raises(SocketRefusedError, match=f"{DAEMON_USER_ENV}='no-such-user-xyz' names no user"):
        named_daemon_uid()


def test_unset_it_is_the_engramd_account_where_there_is_one(monkeypatch):
    monkeypatch.delenv(DAEMON_USER_ENV, raising=False)
    try:
        expected = pwd.getpwnam(DEFAULT_DAEMON_USER).pw_uid
    except KeyError:
        expected = None  # no such account here: nobody but root and the client's own user
    assert named_daemon_uid() == expected
