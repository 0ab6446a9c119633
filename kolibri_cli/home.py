"""Where kolibri keeps what it writes: models, locks and compiled kernels, all under one root.

A bottom module (like errors.py): the store puts models there, the engine its numba cache, and
neither layer has to import the other for the path.
"""

import os
from pathlib import Path

YES_WORDS = ("1", "true", "yes", "on")  # what KOLIBRI_OFFLINE and KOLIBRI_DEBUG read as set


def cache_root() -> Path:
    """`KOLIBRI_HOME`, else `$XDG_CACHE_HOME/kolibri`, else `~/.cache/kolibri`."""
    if home := os.environ.get("KOLIBRI_HOME"):
        return Path(home)
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "kolibri"
