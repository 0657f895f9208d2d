"""The project's one error type: a one-line message that names what is at fault."""


class NpusimError(Exception):
    """Bad model, unsupported op or tensor type, or bad input. The CLI turns it into exit code 2."""


def first_line(e: BaseException, limit: int = 120) -> str:
    """What a one-line NpusimError quotes of another library's exception: the first line of its
    message, at most `limit` characters, or its type's name where it has no message."""
    if not str(e):
        return type(e).__name__
    line = str(e).splitlines()[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."  # cut, not a sentence left open


NUMPY_MAGIC = {b"\x93NUMPY": ".npy", b"PK\x03\x04": ".npz"}


def numpy_load_error(path, e: BaseException) -> str:
    """Why np.load(path, allow_pickle=False) refused the file, in words for the user: numpy calls a
    file that is no .npy or .npz at all "pickled (object) data", as it does a real object array."""
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError:
        head = None
    if head is not None and not any(head.startswith(m) for m in NUMPY_MAGIC):
        return f"not a NumPy file (it begins {head!r}, not the '\\x93NUMPY' header of numpy.save)"
    if "pickled" in str(e):
        return "holds Python objects (dtype object), expected a numeric array"
    return first_line(e)
