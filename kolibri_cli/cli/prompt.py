"""The line reader of `kolibri chat`: line editing and a history kept across sessions.

Python's own `readline` (GNU readline, or libedit where Python is built with it) does the
editing: arrows, Ctrl-A/E, Ctrl-R search, Ctrl-P/N through earlier lines — what Python's own
prompt offers, with no dependency added. prompt_toolkit would bring multi-line input and
completion menus, which a one-line prompt does not need. Bracketed paste is on (GNU readline;
Python turns it off for its own prompt): the terminal marks a paste, and a paste of several lines
is one line read, one turn, ended by Enter. Where there is no readline (Windows:
the console edits lines itself) or stdin is no terminal (a pipe, a test), lines are read plainly
and nothing is kept.

The history is `KOLIBRI_HOME/chat-history`, mode 0600 (what was typed may be private), the last
HISTORY_LINES lines; each line is appended as it is read, so two sessions at once keep both.
"""

import os
import sys
from pathlib import Path

from kolibri_cli.home import cache_root

HISTORY_FILE = "chat-history"
HISTORY_LINES = 1000


def history_path() -> Path:
    return cache_root() / HISTORY_FILE


class LineReader:
    """`read(prompt)` -> the line typed (raises EOFError / KeyboardInterrupt as `input` does)."""

    def __init__(self, keep_history: bool, notify=None):
        self.readline = _readline()
        self.path = None
        if self.readline is not None and keep_history:
            self.path = _load_history(self.readline, history_path(), notify)

    def read(self, prompt: str) -> str:
        line = input(prompt)
        if self.readline is not None and line.strip():
            self.readline.add_history(line)
            if self.path is not None:
                self._keep()
        return line

    def _keep(self) -> None:
        append = getattr(self.readline, "append_history_file", None)  # not in every libedit
        try:
            if append is not None:
                append(1, str(self.path))  # and trims the file to HISTORY_LINES
            else:
                self.readline.write_history_file(str(self.path))
        except OSError:
            self.path = None  # the home went read-only or away: this session keeps none


def _readline():
    """The readline module when stdin and stdout are a terminal (else input() ignores it)."""
    if not (sys.stdin and sys.stdout and sys.stdin.isatty() and sys.stdout.isatty()):
        return None
    try:
        import readline
    except ImportError:
        return None
    if "libedit" not in (readline.__doc__ or ""):  # libedit has no bracketed paste to set
        readline.parse_and_bind("set enable-bracketed-paste on")
    readline.set_auto_history(False)  # lines are added by LineReader.read, blank ones never
    readline.set_history_length(HISTORY_LINES)
    return readline


def _load_history(readline, path: Path, notify) -> Path | None:
    """The earlier sessions' lines into readline; `path` made private first. None (and a note)
    when the home cannot hold it: the session goes on without."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.fchmod(fd, 0o600)  # a file an older kolibri or the user made: private too
        finally:
            os.close(fd)
        readline.read_history_file(str(path))
    except OSError as e:
        if notify:
            notify(f"note: no chat history this session ({path}: {e.strerror or e})")
        return None
    return path
