"""The profile store's writer lock: ``<store>.lock`` holds ``PID@host`` of the one process
that writes. A second writer waits (up to its timeout) or gets :class:`StoreLocked`; a lock
left by a process that no longer runs on this host is broken with a warning."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import time
import warnings
from pathlib import Path

from ..errors import SystemFailure
from ..spec import NotARegularFile, read_regular_file

__all__ = ["StoreLocked", "WriterLock", "pid_alive"]


class StoreLocked(SystemFailure):
    """Another process is writing the store (its PID is in the lock file)."""


class WriterLock:
    """The writer lock of the store at ``store_path``, the file ``lock_path``; ``timeout_s``:
    how long :meth:`acquire` waits for another writer. Construction does no I/O."""

    def __init__(self, *, store_path: Path, lock_path: Path, timeout_s: float = 0.0) -> None:
        self.store_path = store_path
        self.lock_path = lock_path
        self.timeout_s = timeout_s

    def acquire(self) -> None:
        try:
            self._try_acquire()
        except OSError as e:  # no folder, no permission, a read-only file system
            raise SystemFailure(f"{self.lock_path}: cannot take the profile store's writer lock: "
                                f"{e.strerror or e}") from None

    def _try_acquire(self) -> None:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        me = f"{os.getpid()}@{socket.gethostname()}"
        deadline = time.monotonic() + self.timeout_s
        # The lock appears with its holder already written: the PID goes into a file of this
        # process's own, which is then hard-linked to the lock name (atomic, fails when the lock
        # exists; also on NFS). A writer killed at any moment leaves either no lock or one that
        # names its dead PID, never an empty lock that nobody can tell from one being created.
        mine = self.lock_path.with_name(f"{self.lock_path.name}.{os.getpid()}")
        while True:
            try:
                created = self._create_lock(mine, me)
            except FileExistsError:
                created = False
            if not created:
                holder = self._holder()
                if _is_dead(holder) and self._break_stale():
                    continue
                if time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
                who = f"PID {holder[0]} on {holder[1]}" if holder else "a process starting to write"
                raise StoreLocked(f"store locked by {who}: {self.store_path} is being written; wait for it to finish, "
                                  f"or remove {self.lock_path} if that process is gone")
            return

    def _break_stale(self) -> bool:
        """Remove the lock if it still names a dead process; True when it was removed.

        Two writers that both saw the dead holder must not both break: the second would
        delete the lock the first had just taken, and both would write. So the holder is read
        again and the lock removed under an exclusive ``flock`` of a separate guard file;
        between that read and the removal nobody else can remove the lock, and nobody can
        create one while it exists, so what is removed is the dead holder's lock."""
        import fcntl

        guard = self.lock_path.with_name(f".{self.lock_path.name}.guard")
        try:
            fd = os.open(guard, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise SystemFailure(f"{guard}: cannot open the guard of the profile store's writer lock: "
                                f"{e.strerror or e}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SystemFailure(f"{guard}: the guard of the profile store's writer lock is not a regular "
                                    "file; remove it")
            fcntl.flock(fd, fcntl.LOCK_EX)
            holder = self._holder()
            if not _is_dead(holder):
                return False
            warnings.warn(f"breaking the stale lock {self.lock_path} of PID {holder[0]} "
                          "(that process no longer runs)", stacklevel=7)
            with contextlib.suppress(FileNotFoundError):
                self.lock_path.unlink()
            with contextlib.suppress(FileNotFoundError):  # its own file, if it died before removing it
                self.lock_path.with_name(f"{self.lock_path.name}.{holder[0]}").unlink()
            return True
        finally:
            os.close(fd)  # releases the flock

    def _create_lock(self, mine: Path, me: str) -> bool:
        """Create the lock holding ``me``; False when another holder has it (FileExistsError
        may also come through from the fallback)."""
        with open(mine, "w") as fh:
            fh.write(me + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(mine, self.lock_path)
            return True
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: create-exclusive, then write
            fd = os.open(self.lock_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            with os.fdopen(fd, "w") as fh:
                fh.write(me + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            return True
        finally:
            with contextlib.suppress(FileNotFoundError):
                mine.unlink()

    def _holder(self) -> tuple[int, str] | None:
        """(PID, host) from the lock file; None while it is being created or is unreadable."""
        try:
            # Only a regular file is read, and only its first bytes: a FIFO there would block
            # every writer and a link to /dev/zero would fill its memory.
            text = read_regular_file(self.lock_path, 4096, follow_links=False).decode("utf-8", "replace").strip()
        except FileNotFoundError:
            return None
        except NotARegularFile as e:
            raise SystemFailure(f"{self.lock_path}: the profile store's writer lock {e.strerror}; "
                                "remove it (a lock is a file this tool creates)") from None
        try:
            pid_s, host = text.split("@", 1)
            return int(pid_s), host
        except ValueError:
            # Empty or garbled: a writer between O_EXCL and write(), or a kill right
            # there. Old enough means the latter; treat it as a lock of a dead PID.
            try:
                age = time.time() - self.lock_path.stat().st_mtime
            except FileNotFoundError:
                return None
            return (0, socket.gethostname()) if age > 5 else None

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.lock_path.unlink()


def _is_dead(holder: tuple[int, str] | None) -> bool:
    """True for a lock holder that is a process of this host that no longer runs."""
    return holder is not None and holder[1] == socket.gethostname() and not pid_alive(holder[0])


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` of this host runs (a zombie does not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) holds nothing
        proc = Path(f"/proc/{pid}/stat").read_text()
        return proc.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
