"""The project's one error type: a one-line message that names what is at fault."""


class NpusimError(Exception):
    """Bad model, unsupported op or tensor type, or bad input. The CLI turns it into exit code 2."""
