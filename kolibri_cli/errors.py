"""The one error family a user can fix; the CLI turns it into one line on stderr."""


class KolibriError(Exception):
    """Something the user can fix: the message says what was wrong and what to do."""

    exit_code = 1


class OfflineError(KolibriError):
    """Network needed but forbidden (KOLIBRI_OFFLINE=1) or unreachable."""
