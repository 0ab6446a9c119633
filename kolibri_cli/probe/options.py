"""How a `kolibri probe` option is declared: once, as a ProbeConfig field whose metadata holds
its flags, help, `--help` panel and the type the command line gives it (`opt`). PROBE.toml's
keys, the typer command (cli/probe.py builds its signature from them), the regenerating command
and `--help`'s panels all read that one declaration. Non-goals: parsing values (config.py),
typer itself (only cli/ imports it).
"""

from dataclasses import MISSING, dataclass, field

from kolibri_cli.costs.model import GUESSED_COSTS

SIMULATE, PRICE, MEASURE, REPORT, SCALE = ("What to simulate", "Pricing: c(n)",
                                           "Measuring with the model", "Reports and gates",
                                           "Scale")


@dataclass(frozen=True)
class Option:
    """One option of a ProbeConfig field (the field's name is its PROBE.toml key); `kind` is
    what the command line hands over: text, int, float, switch (--x/--no-x), path, list
    (repeatable text)."""

    flags: tuple[str, ...]  # e.g. ("--model", "-m"); a switch: ("--measure/--no-measure",)
    kind: str
    panel: str
    help: str
    metavar: str | None = None
    toml: bool = True  # a PROBE.toml key too (--ray-address is the command line's spelling)

    @property
    def flag(self) -> str:
        """The long flag, as the regenerating command writes it."""
        return self.flags[0].split("/")[0]


def opt(flags, kind: str, panel: str, *, help: str, metavar: str | None = None,
        default=None, default_factory=MISSING, toml: bool = True):
    """A ProbeConfig field declared as an option (`flags`: one flag, or a tuple of them)."""
    flags = (flags,) if isinstance(flags, str) else tuple(flags)
    option = Option(flags, kind, panel, help, metavar, toml)
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata={"option": option})
    return field(default=default, metadata={"option": option})


def guess_text() -> str:
    """"c(2..3) = 1.32, 1.47, then the last slope": the guess as the help gives it."""
    top = max(GUESSED_COSTS)
    values = ", ".join(f"{GUESSED_COSTS[n]:g}" for n in range(2, top + 1))
    return f"c(2..{top}) = {values}, then the last slope"
