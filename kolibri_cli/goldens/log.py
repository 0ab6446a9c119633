"""Golden chains appended to a JSONL file as they finish (a server's traffic, `kolibri serve
--record`), so the probe can answer on it while it grows.

Each chain is one `write` of its whole line to a file opened for appending: a reader, or a
process killed between two chains, sees whole lines only. One file per writer (its name carries
the start time and the process id), never shared, never rewritten, and made by the first
chain: a run that recorded nothing (or was killed before) leaves no file.
Non-goals: rotation, compression (shard the folder afterwards), more than one writer per file.
"""

import os
import time
from pathlib import Path

from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.chains import Golden, golden_line


class GoldenLog:
    """`GoldenLog(folder)`: `folder` made if missing and checked writable; `add(golden)`
    appends to a new file in it, created by the first call."""

    def __init__(self, folder: str | Path):
        folder = Path(folder)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        self.path = folder / f"serve-{stamp}-{os.getpid()}.jsonl"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if not os.access(folder, os.W_OK | os.X_OK):
                raise PermissionError(13, "Permission denied")
        except OSError as e:
            raise KolibriError(f"{self.path}: cannot be created ({e.strerror}); pick another "
                               "folder") from None
        self._fd = -1
        self.count = 0

    def add(self, golden: Golden) -> None:
        data = golden_line(golden).encode("utf-8")
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND,
                               0o644)
        before = os.fstat(self._fd).st_size
        written = os.write(self._fd, data)
        if written != len(data):  # a full disk: cut the torn line off again
            os.ftruncate(self._fd, before)
            raise OSError(f"{self.path}: short write ({written} of {len(data)} bytes)")
        self.count += 1

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
