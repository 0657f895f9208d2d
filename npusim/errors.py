"""The project's one error type: a one-line message that names what is at fault."""


class NpusimError(Exception):
    """Bad model, unsupported op or tensor type, or bad input. The CLI turns it into exit code 2."""


def first_line(e: BaseException, limit: int = 120) -> str:
    """What a one-line NpusimError quotes of another library's exception: the first line of its
    message, at most `limit` characters, or its type's name where it has no message."""
    return str(e).splitlines()[0][:limit] if str(e) else type(e).__name__
