"""How many connections the daemon keeps on its ipc sockets, in all and per user.

Every connection costs a descriptor, and the descriptors are bounded (guards/fd_limits.py
sets ``limit`` from RLIMIT_NOFILE).  A connection is counted from its accept to its close,
handshake or not, on both sockets together, under the uid the kernel names (SO_PEERCRED).
One user other than root and the daemon's own holds at most ``limit // USER_SHARE``: the
rest are kept for other users, whatever one user's processes do (a node's ranks use two
connections each: requests and events).  Root and the daemon's own user are trusted (they
can stop the daemon anyway): no share applies to them, and RESERVED_PLACES beyond the limit
are theirs alone, so an operator's ``engramd status`` is answered even while the places are
full.  A connection refused is closed at once: the peer sees its connection end.
"""
from __future__ import annotations

from .bounds import RESERVED_PLACES, USER_SHARE


class Places:
    def __init__(self, limit: int, trusted: frozenset[int]):
        self.limit = limit
        self.per_user = max(1, limit // USER_SHARE)
        self.trusted = trusted  # uids with no share and the reserve: root and the daemon's own
        self.taken = 0
        self.refused = 0
        self._by_user: dict[int, int] = {}

    def take(self, uid: int) -> str | None:
        """Take a place for a connection of ``uid``: None, or why there is none."""
        held = self._by_user.get(uid, 0)
        if uid in self.trusted:
            if self.taken >= self.limit + RESERVED_PLACES:
                return self._refuse(f"{self.taken} connections are open, the most the open-file limit allows "
                                    f"with the {RESERVED_PLACES} kept for root and the daemon's user")
        elif held >= self.per_user:
            return self._refuse(f"uid {uid} holds {held} connections, the most one user may (a quarter of "
                                f"{self.limit}: the rest are kept for other users)")
        elif self.taken >= self.limit:
            return self._refuse(f"{self.taken} connections are open, the most the open-file limit allows")
        self.taken += 1
        self._by_user[uid] = held + 1
        return None

    def _refuse(self, why: str) -> str:
        self.refused += 1
        return why

    def give_back(self, uid: int) -> None:
        self.taken -= 1
        held = self._by_user.pop(uid) - 1
        if held:
            self._by_user[uid] = held

    def held_by(self, uid: int) -> int:
        return self._by_user.get(uid, 0)
