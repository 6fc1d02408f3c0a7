"""Connection places: a quarter per user, the limit in all, and a reserve that only root and the
daemon's own user reach."""
from __future__ import annotations

from engramd.wire.bounds import RESERVED_PLACES
from engramd.wire.places import Places


def test_one_user_keeps_a_quarter_and_other_users_the_rest():
    places = Places(16, trusted=frozenset({0}))
    assert [places.take(1000) for _ in range(4)] == [None] * 4
    assert "uid 1000 holds 4 connections" in places.take(1000)
    assert [places.take(uid) for uid in (1001, 1001, 1001, 1001, 1002, 1002, 1002, 1002, 1003, 1003, 1003,
                                         1003)] == [None] * 12
    assert "16 connections are open" in places.take(1004)
    assert places.refused == 2


def test_root_and_the_daemons_user_get_the_reserve_and_no_share():
    places = Places(8, trusted=frozenset({0, 999}))
    assert [places.take(0) for _ in range(8 + RESERVED_PLACES - 1)] == [None] * (8 + RESERVED_PLACES - 1)
    assert "15 connections are open" in places.take(1000)  # its share (2) is free, but the limit is taken
    assert places.take(999) is None
    assert "kept for root" in places.take(0)


def test_a_place_given_back_can_be_taken_again():
    places = Places(4, trusted=frozenset())
    assert places.take(5) is None
    assert places.take(5) is not None  # a quarter of 4
    places.give_back(5)
    assert places.held_by(5) == 0 and places.taken == 0
    assert places.take(5) is None
