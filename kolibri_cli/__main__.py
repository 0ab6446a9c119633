"""The `kolibri` command (and `python -m kolibri_cli`): import the command line, then run it.

On a first run the imports take seconds (numba, numpy and the rest are compiled to bytecode as
they are first imported: the README installs with `--no-compile`), so on a terminal a live line
names each module as Python imports it, and a Ctrl-C at any point, imports included, ends with
one line and exit 130 instead of a traceback.
"""

import importlib.util
import os
import shutil
import sys
import time
from contextlib import contextmanager

INTERRUPTED = 130  # 128 + SIGINT, as the command line's own boundary (cli/app.py) exits
REFRESH_S = 0.1  # the import line is rewritten at most this often


def main() -> None:
    try:
        with _imports_line(sys.stderr):
            from kolibri_cli.cli import app
        app(prog_name="kolibri")
    except KeyboardInterrupt:  # before (or outside) the command line's own boundary
        sys.stderr.write("\ninterrupted\n")
        sys.exit(INTERRUPTED)


class _ImportLine:
    """A finder first on sys.meta_path that finds nothing: it sees each import as it starts and
    rewrites one line on the terminal with the module's name and the count so far."""

    def __init__(self, stream):
        self.stream, self.count, self.shown_at, self.width = stream, 0, 0.0, 0

    def find_spec(self, name, path=None, target=None):
        self.count += 1
        now = time.monotonic()
        if now - self.shown_at >= REFRESH_S:
            self.shown_at = now
            self.show(f"starting: {self.count} modules imported (Python compiles those not "
                      f"cached yet): {name}")
        return None  # the next finders import it

    def show(self, text: str) -> None:
        columns = shutil.get_terminal_size().columns
        line = text[: max(columns - 1, 0)]
        try:
            self.stream.write("\r" + line.ljust(self.width) + "\r")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # the terminal went away: the command itself will say so, or not
        self.width = len(line)


@contextmanager
def _imports_line(stream):
    """The live import line, on a terminal and when the imports compile bytecode (numba's is not
    cached: a first run, or PYTHONDONTWRITEBYTECODE); cleared at the end. Not while a shell
    completes a word (typer's _KOLIBRI_COMPLETE): its stderr is the user's terminal."""
    if "_KOLIBRI_COMPLETE" in os.environ or not (_is_terminal(stream) and _compiles("numba")):
        yield
        return
    line = _ImportLine(stream)
    sys.meta_path.insert(0, line)
    try:
        yield
    finally:
        sys.meta_path.remove(line)
        line.show("")


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _compiles(module: str) -> bool:
    """Whether importing `module` compiles its source: no bytecode of it is cached."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    return bool(spec and spec.cached and spec.has_location and not os.path.exists(spec.cached))


if __name__ == "__main__":
    main()
