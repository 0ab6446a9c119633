"""Outside text (file contents, names, the user's arguments): read as UTF-8 from what is really
a file, and made safe to put in a one-line message or on a terminal (no escape sequences, no
lone surrogates, bounded length); outside numbers read as finite floats; a typed argument's
backslash escapes read as llama.cpp reads them."""

import math
import os
import re


def shown(value, limit: int = 60) -> str:
    """`value` as !r would show it (escape sequences and newlines escaped), cut to `limit`."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def finite(value) -> float | None:
    """A parsed JSON or TOML number as a finite float, else None (bools, non-numbers, NaN,
    infinities, and integers past float's range, on which float() raises OverflowError)."""
    if type(value) not in (int, float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


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


def read_text_file(path, what: str = "file") -> str:
    """A user-named text file, whole, as UTF-8. A FIFO is read like a file; a device (/dev/zero
    never ends) or a socket is refused; every failure is one KolibriError naming the path."""
    import stat

    from kolibri_cli.errors import KolibriError

    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            raise KolibriError(f"{path}: is a folder, expected a {what}")
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
            raise KolibriError(f"{path}: is a device or socket, expected a {what}")
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise KolibriError(f"{path}: {what} not found") from None
    except OSError as e:
        raise KolibriError(f"{path}: cannot read the {what} ({e.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise KolibriError(f"{path}: not UTF-8 text (byte {e.start}); the {what} must be UTF-8"
                           ) from None


def open_regular(path, what: str, limit: int | None = None):
    """A user-named file opened for reading in binary, when it is a regular file (a FIFO would
    block for ever, /dev/zero never ends) of at most `limit` bytes; else one KolibriError naming
    the path. Opened without blocking, then checked on the open file (no race with a rename)."""
    import stat

    from kolibri_cli.errors import KolibriError

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise KolibriError(f"{path}: cannot read the {what} ({e.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO"
                if stat.S_ISFIFO(st.st_mode) else "a device or socket")
        raise KolibriError(f"{path}: is {kind}, expected a {what} (a regular file)")
    if limit is not None and st.st_size > limit:
        os.close(fd)
        raise KolibriError(f"{path}: {st.st_size:,} bytes, more than a {what} may hold "
                           f"({limit:,})")
    return os.fdopen(fd, "rb")


# what a backslash and the character after it stand for (llama.cpp's string_process_escapes)
_ESCAPES = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"'": b"'", b'"': b'"', b"\\": b"\\"}
_ESCAPE = re.compile(rb"\\(x[0-9a-fA-F]{2}|.)", re.DOTALL)


def process_escapes(text: str, what: str = "the text") -> str:
    r"""`text` as llama.cpp's CLI reads an argument (its `-e`, on by default): \n \r \t \' \"
    \\ stand for their characters and \xHH for a byte of the UTF-8 text (\xc3\xa9 is é); any
    other backslash stays as typed. A shell passes "\n" as a backslash and an n."""
    from kolibri_cli.errors import KolibriError

    def one(m: re.Match) -> bytes:
        code = m.group(1)
        if len(code) == 3:
            return bytes([int(code[1:], 16)])
        return _ESCAPES.get(code, m.group(0))

    data = _ESCAPE.sub(one, text.encode("utf-8", "surrogatepass"))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise KolibriError(f"{what} is not UTF-8 once its escapes are read (byte "
                           f"0x{data[e.start]:02x} at offset {e.start}, from a \\x escape); "
                           "write whole UTF-8 characters, or --no-escape to keep backslashes "
                           "as typed") from None
