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
import tempfile
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


@contextmanager
def replacing(path, text: bool = False, newline: str | None = None):
    """`with replacing(path) as f: ...`: f is a binary file (text=True: a UTF-8 text file) whose
    contents replace `path` when the block ends without an error, and never otherwise. Raises
    WriteFailed, naming path and the cause, where the file could not be written. A path that is not
    a regular file (/dev/stdout, a pipe) is written in place, every write checked: it cannot be
    replaced. A symbolic link's target is replaced, the link kept."""
    path = Path(path)
    real = Path(os.path.realpath(path))
    if real.exists() and not real.is_file():
        with _in_place(path, text, newline) as f:
            yield f
        return
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent)
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
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes it private; an output is an ordinary file
        os.close(fd)
        fd = None
        os.replace(tmp, real)
        tmp = None
    except OSError as e:
        raise WriteFailed(path, e) from None
    finally:
        if fd is not None:
            os.close(fd)
        if tmp is not None:
            try:
                os.unlink(tmp)
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
