"""Output files written whole or not at all: to a temporary name in the same folder, every byte's
write checked, synced, then renamed over the path. On any failure the previous file is left as it
was, the temporary one is removed, and the error names the file and the cause.

Why every write is checked here: np.save into a real file hands the array to C's fwrite (numpy's
tofile), which ignores a short write, so under a file-size limit `npusim run --output` exited 0 with
a truncated file, and on a full disk numpy raised an OSError with neither a message nor a file name
("cannot write output: None: None"). The file object given to the writer is not a real file to
numpy: every write goes through os.write, whose short write or error is seen; and the size synced
to disk is checked against what was written.
"""

from __future__ import annotations

import errno
import io
import os
import stat
from contextlib import contextmanager
from pathlib import Path


class CheckedFile(io.RawIOBase):
    """A binary file whose every write is whole (or an OSError), and that knows how far it wrote."""

    def __init__(self, fd: int, path: str):
        self.fd, self.path, self.end, self.position = fd, path, 0, 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:  # a pipe is not: np.savez's zip then writes without seeking back
        try:
            os.lseek(self.fd, 0, os.SEEK_CUR)
            return True
        except OSError:
            return False

    def readable(self) -> bool:
        return False

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            n = os.write(self.fd, view[done:])
            if n <= 0:  # a write that takes nothing: the disk is full
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)
            done += n
        self.position += done
        self.end = max(self.end, self.position)
        return done

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.position = os.lseek(self.fd, offset, whence)
        return self.position

    def tell(self) -> int:
        return self.position


def cause(e: OSError) -> str:
    """What went wrong, in words, for an OSError however it was raised."""
    if e.strerror:
        return e.strerror
    if e.errno:
        return os.strerror(e.errno)
    return str(e) or type(e).__name__


class WriteFailed(OSError):
    """An output file could not be written; the previous one (if any) is kept. Its filename is the
    path, its strerror the cause (both set, as callers that name an OSError's read them)."""

    def __init__(self, path, e: OSError):
        super().__init__(e.errno or errno.EIO, cause(e), str(path))
        self.kept = os.path.isfile(path)  # a previous file, left as it was

    def message(self, what: str = "") -> str:
        """`cannot write [what ]PATH: CAUSE[; the previous file is kept]`."""
        kept = "; the previous file is kept" if self.kept else ""
        return f"cannot write {what + ' ' if what else ''}{self.filename}: {self.strerror}{kept}"

    def __str__(self) -> str:
        return self.message()


TMP_SUFFIX = ".tmp"


def _temp_name(name: str) -> str:
    """A temporary name beside `name` that says whose it is: `.NAME.PID.RANDOM.tmp`."""
    return f".{name}.{os.getpid()}.{os.urandom(4).hex()}{TMP_SUFFIX}"


def _remove_stale_temps(dir_fd: int, name: str) -> None:
    """Remove the temporary files a killed writer of `name` left beside it (SIGKILL at the fsync):
    only those of this user's whose writer's pid no longer runs."""
    prefix = f".{name}."
    for entry in os.listdir(dir_fd):
        if not (entry.startswith(prefix) and entry.endswith(TMP_SUFFIX)):
            continue
        pid = entry[len(prefix) : -len(TMP_SUFFIX)].split(".")[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # its writer runs
        except ProcessLookupError:
            pass
        except OSError:
            continue  # another user's process
        try:
            if os.stat(entry, dir_fd=dir_fd, follow_symlinks=False).st_uid == os.getuid():
                os.unlink(entry, dir_fd=dir_fd)
        except OSError:
            pass


@contextmanager
def replacing(path, text: bool = False, newline: str | None = None):
    """`with replacing(path) as f: ...`: f is a binary file (text=True: a UTF-8 text file) whose
    contents replace `path` when the block ends without an error, and never otherwise. Raises
    WriteFailed, naming path and the cause, where the file could not be written. A path that is not
    a regular file (/dev/stdout, a pipe) is written in place, every write checked: it cannot be
    replaced. A symbolic link to a regular file (or to nothing) is refused: the path's folder is
    opened by the kernel's own resolution and the file created and renamed in it by name, so a link
    is never followed in user space, nor swapped in between a check and the rename. An existing
    file's mode is kept."""
    path = Path(path)
    folder, name = os.path.split(os.fspath(path))
    try:
        dir_fd = os.open(folder or ".", os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise WriteFailed(path, e) from None
    try:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        except OSError as e:
            raise WriteFailed(path, e) from None
        if st is not None and stat.S_ISLNK(st.st_mode):
            try:
                target = os.stat(name, dir_fd=dir_fd)
            except OSError:
                target = None
            if target is None or stat.S_ISREG(target.st_mode):
                raise WriteFailed(
                    path, OSError(errno.ELOOP, "it is a symbolic link; give the path of the file itself")
                )
            st = target  # a link to a device or a pipe (/dev/stdout): written in place
        if st is not None and not stat.S_ISREG(st.st_mode):
            with _in_place(path, text, newline) as f:
                yield f
            return
        _remove_stale_temps(dir_fd, name)
        with _replacing_in(dir_fd, name, path, st, text, newline) as f:
            yield f
    finally:
        os.close(dir_fd)


@contextmanager
def _replacing_in(dir_fd: int, name: str, path: Path, st, text: bool, newline: str | None):
    """replacing() of `name` in the open folder dir_fd; st: the file it replaces, if any."""
    tmp = _temp_name(name)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    except OSError as e:
        raise WriteFailed(path, e) from None
    try:
        raw = CheckedFile(fd, tmp)
        # write_through: nothing is held back in the wrapper, to be written after the file is gone.
        f = io.TextIOWrapper(raw, encoding="utf-8", newline=newline, write_through=True) if text else raw
        yield f
        os.fsync(fd)
        if os.fstat(fd).st_size != raw.end:  # belt and braces: what the disk holds is what was written
            raise OSError(errno.EIO, f"{os.fstat(fd).st_size} bytes on disk, {raw.end} written")
        if st is not None:
            mode = stat.S_IMODE(st.st_mode)  # the file it replaces keeps its mode (a private 600)
        else:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask  # created private; a new output is an ordinary file
        os.fchmod(fd, mode)
        os.close(fd)
        fd = None
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        tmp = None
    except OSError as e:
        raise WriteFailed(path, e) from None
    finally:
        if fd is not None:
            os.close(fd)
        if tmp is not None:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError:
                pass


@contextmanager
def _in_place(path: Path, text: bool, newline: str | None):
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as e:
        raise WriteFailed(path, e) from None
    try:
        raw = CheckedFile(fd, str(path))
        yield io.TextIOWrapper(raw, encoding="utf-8", newline=newline, write_through=True) if text else raw
    except OSError as e:
        raise WriteFailed(path, e) from None
    finally:
        os.close(fd)


def write_bytes(path, data: bytes) -> None:
    with replacing(path) as f:
        f.write(data)


def write_text(path, text: str, newline: str | None = "\n") -> None:
    with replacing(path, text=True, newline=newline) as f:
        f.write(text)
