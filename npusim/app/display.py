"""Names from a model file as a terminal shows them: a tensor or op name is the file's, and a file can
hold anything in it. A control character reaches the terminal escaped (`\\x1b`, `\\x0a`), never as
an escape sequence the terminal would run or a line end that would break a table; a long list of
tensors is abbreviated to its count, its first and its last entries.
"""

from __future__ import annotations

LIST_HEAD = 2  # entries shown before the "..." of an abbreviated list
LIST_LIMIT = 6  # lists longer than this are abbreviated (a CONCATENATION of a few stays whole)


def shown(text: str) -> str:
    """text with every non-printable character (C0 and C1 controls, DEL, line and paragraph
    separators, ...) as a \\x.. or \\u.... escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shown_lines(text: str) -> str:
    """A whole report: each line shown(), the line ends kept (a name's own line end is escaped where
    the report writes the name, with shown())."""
    return "\n".join(shown(line) for line in text.split("\n"))


def abbreviated(items: list, what: str) -> str:
    """`a, b, c` for a short list; `128 outputs: a, b, ... z` for a long one."""
    items = [str(i) for i in items]
    if len(items) <= LIST_LIMIT:
        return ", ".join(items)
    return f"{len(items)} {what}: {', '.join(items[:LIST_HEAD])}, ... {items[-1]}"
