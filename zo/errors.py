"""The zo package's error types: one-line messages that name what is at fault."""


class ZoError(Exception):
    """Base class for errors the zo toolkit reports to the user."""


class DataError(ZoError):
    """A data set that cannot be read or does not have the expected layout, shapes or labels."""
