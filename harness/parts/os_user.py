"""The OS identity a child process runs as.

PostgreSQL refuses to run as root, and a worker under test should not hold
more privilege than a real deployment would, so when the harness runs as root
it starts those processes as the unprivileged `postgres` user. Off root it
simply uses the current user.

Invariant: an `OsUser` always names an existing account, and the uid/gid pair
is what `subprocess.Popen(user=uid, group=gid, extra_groups=[])` should get;
passing `user=` alone would leave the child in gid 0 (root's group).
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

UNPRIVILEGED_NAME = "postgres"


@dataclass(frozen=True)
class OsUser:
    """One OS account: login name, numeric ids and home directory."""

    name: str
    uid: int
    gid: int
    home: str

    @classmethod
    def by_name(cls, name: str) -> OsUser:
        """Look the account up in the password database; KeyError names it."""
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise KeyError(f"OS user {name!r} does not exist") from None
        return cls(name=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir)

    @classmethod
    def current(cls) -> OsUser:
        """The effective user this Python process runs as."""
        entry = pwd.getpwuid(os.geteuid())
        return cls(name=entry.pw_name, uid=entry.pw_uid, gid=os.getegid(), home=entry.pw_dir)

    def popen_kwargs(self) -> dict[str, object]:
        """Keyword arguments for `subprocess.Popen` that switch to this user.

        Empty when this is already who we are: a non-root process cannot
        setuid, and asking it to would fail for no benefit.
        """
        me = OsUser.current()
        if (me.uid, me.gid) == (self.uid, self.gid):
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def env(self) -> dict[str, str]:
        """The identity variables a login would set; libraries read them."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}


def is_root() -> bool:
    """True when the effective uid is 0."""
    return os.geteuid() == 0


def unprivileged_user(name: str = UNPRIVILEGED_NAME) -> OsUser:
    """The identity to run servers and workers as.

    As root: the `postgres` account (PostgreSQL will not start as root).
    Otherwise: the current user, since we could not switch anyway.
    """
    if is_root():
        return OsUser.by_name(name)
    return OsUser.current()


def first_untraversable(path: Path, user: OsUser) -> Path | None:
    """The first directory on `path`'s way from / that `user` cannot enter.

    Checks the classic owner/group/other execute bits (no ACLs, and only the
    primary group, because children get `extra_groups=[]`). Returns None when
    every directory is traversable. Root can enter anything.
    """
    if user.uid == 0:
        return None
    resolved = path.resolve()
    chain = [*reversed(resolved.parents), resolved]
    for directory in chain:
        try:
            st = directory.stat()
        except FileNotFoundError:
            return directory
        if not stat.S_ISDIR(st.st_mode):
            continue
        if st.st_uid == user.uid:
            bit = stat.S_IXUSR
        elif st.st_gid == user.gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return directory
    return None


def give_to(path: Path, user: OsUser) -> None:
    """Make `user` the owner of `path` (a file or a directory the harness made).

    A no-op when we are not root: only root can give files away, and then the
    child runs as ourselves anyway.
    """
    if is_root() and user.uid != 0:
        os.chown(path, user.uid, user.gid)
