"""Outside text (file contents, names, the user's arguments) made safe to put in a message or
on a terminal: one line, no escape sequences, no lone surrogates, bounded length."""


def shown(value, limit: int = 60) -> str:
    """`value` as !r would show it (escape sequences and newlines escaped), cut to `limit`."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def printable(text: str, limit: int = 80) -> str:
    """`text` itself when it is short and printable, else `shown(text)`."""
    return text if len(text) <= limit and text.isprintable() else shown(text, limit)


def clean(text) -> str:
    """`text` with every unprintable character (control characters and escape sequences,
    newlines, lone surrogates) written as its Python escape (\\x1b, \\n, \\ud800)."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
