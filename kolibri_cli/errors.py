"""The one error family a user can fix; the CLI turns it into one line on stderr."""


class KolibriError(Exception):
    """Something the user can fix: the message says what was wrong and what to do."""

    exit_code = 1


class OfflineError(KolibriError):
    """Network needed but forbidden (KOLIBRI_OFFLINE=1) or unreachable."""


def refuse_unused(options: dict, needs: str) -> None:
    """Options given (not None) that mean nothing without `needs`: one error line naming them,
    not a run that silently drops them (the user likely forgot `needs`, or misread an option)."""
    if given := [name for name, value in options.items() if value is not None]:
        raise KolibriError(f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} {needs}")
