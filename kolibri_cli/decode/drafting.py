"""What a command drafts with: a proposer from command-line settings, the c(n) it drafts by and
where they came from, and the timings a proposer reading a cost table keeps for the next run.
One set of choices for `kolibri generate`, `chat`, `bench` and `serve`, each made by the
proposer's declared `costs_kind` (proposers/protocol.py), never by its name.

Non-goals: choosing among given, benched and guessed c(n) (costs/pricing.py), storing timings
(costs/model.py), parsing options (cli/).
"""

from collections.abc import Callable

from kolibri_cli.costs.model import CostTable, keep_table, warm_table
from kolibri_cli.costs.pricing import Pricing, asked, for_model, parse_costs
from kolibri_cli.decode.proposers import (
    DEFAULT_PROPOSER,
    PROPOSERS,
    LlamaCppOptions,
    Proposer,
    default_settings,
    make_proposer,
    parse_window,
    proposer_class,
)
from kolibri_cli.engine.jit import get_threads
from kolibri_cli.errors import KolibriError
from kolibri_cli.text import shown

Note = Callable[[str], None]  # one line for stderr


def new_proposer(k: int | None, window: str | None, name: str = DEFAULT_PROPOSER,
                 llamacpp: LlamaCppOptions | None = None, costs=None) -> Proposer:
    """A fresh proposer from command-line settings (bad settings fail before a model loads);
    k or window None = the proposer's default; `costs` the c(n) it drafts by (`pricing`) or the
    table it reads (`warm_costs`); one that reads a table, given none, measures its own from
    nothing."""
    if k is not None and k < 1:  # name the option; make_proposer's own check speaks of "k"
        raise KolibriError(f"--k must be at least 1 (got {k})")
    default_k, default_window = default_settings(name)
    if costs is None and proposer_class(name).costs_kind == "table":
        costs = CostTable()
    return make_proposer(name, default_k if k is None else k,
                         default_window if window is None else parse_window(window), costs,
                         llamacpp=llamacpp)


def bench_proposers(k: int | None, window: str | None, name: str,
                    llamacpp: LlamaCppOptions | None) -> Callable[[dict], Proposer]:
    """proposer(costs) for `kolibri bench`: one taking c(n) as numbers drafts by the c(n) the run
    measured (`costs`), as generate drafts by the stored bench; one reading a table times its
    own, as in generate."""
    numbers = proposer_class(name).costs_kind == "numbers"
    return lambda costs: new_proposer(k, window, name, llamacpp, costs if numbers else None)


def asked_costs(text: str | None, name: str) -> Pricing | None:
    """--costs as given (a Pricing), None when not given; checked before a model loads."""
    if text is None:
        return None
    if proposer_class(name).costs_kind is None:
        priced = [n for n, cls in PROPOSERS.items() if cls.costs_kind is not None]
        raise KolibriError(f"--costs prices {', '.join(priced[:-1])} and {priced[-1]}; "
                           f"--proposer {name} drafts without c(n)")
    if text.strip() == "default":
        return asked(None, use_bench=False)
    return asked(parse_costs(text.split(","), shown(text), "--costs"))


def pricing(name: str, given: Pricing | None, model, note: Note) -> Pricing | None:
    """The c(n) proposer `name` drafts by on `model` (costs/pricing.py, as the probe chooses):
    --costs; else, for one taking c(n) as numbers, the latest `kolibri bench` of this model, its
    numerics and the threads the kernel runs, else the guess (`note` says so). None: the
    proposer drafts without c(n), or reads a table it times itself."""
    kind = proposer_class(name).costs_kind
    if kind == "table":
        return given if given is not None and given.source == "given" else None
    if kind is None:
        return None
    chosen = given or for_model(model.name, model.sha256, model.numerics, get_threads())
    if chosen.note:
        note(chosen.note)
    return chosen


def warm_costs(name: str, given: Pricing | None, model,
               threads: int | None = None) -> CostTable | None:
    """The measuring table proposer `name` drafts by when it reads one and no --costs was given:
    started from what earlier runs of this kernel (on `threads`, default the kernel's) timed
    (costs/model.py warm_table); None for other proposers or with --costs (numbers: frozen;
    `default`: it starts cold, ignoring what is stored)."""
    if proposer_class(name).costs_kind != "table" or given is not None:
        return None
    return warm_table(model.sha256, model.numerics, threads or get_threads())[0]


class Drafting:
    """The one drafting set-up of `kolibri generate`, `chat` and `serve`: the proposer's
    settings (checked before a model loads: `checked`), then, given the model (`drafting_for`),
    the c(n) it drafts by and where they came from, a fresh proposer per generation (`new`) and
    its timings kept for the next run (`keep`)."""

    def __init__(self, name: str, k: int | None, window: str | None,
                 llamacpp: LlamaCppOptions | None, given: Pricing | None):
        self.name, self.k, self.window, self.llamacpp, self.given = name, k, window, llamacpp, given
        self.model, self.pricing, self.threads = None, None, None

    @classmethod
    def checked(cls, k: int | None, window: str | None, name: str = DEFAULT_PROPOSER,
                llamacpp: LlamaCppOptions | None = None, costs: str | None = None) -> "Drafting":
        """The command line's settings (--k, --window, --proposer, llama.cpp's, --costs), each
        refused here with one error line when bad."""
        new_proposer(k, window, name, llamacpp)
        return cls(name, k, window, llamacpp, asked_costs(costs, name))

    def settings(self) -> Proposer:
        """A proposer of these settings drafting by nothing chosen yet (what fits the model)."""
        return new_proposer(self.k, self.window, self.name, self.llamacpp)

    def for_model(self, model, note: Note, threads: int | None = None) -> "Drafting":
        """Choose the c(n) it drafts by on `model` (`pricing`: a guess is said through `note`),
        the kernel running `threads` (default: the caller's)."""
        self.model, self.threads = model, threads
        self.pricing = pricing(self.name, self.given, model, note)
        return self

    def costs(self):
        """What a new proposer drafts by: the chosen c(n), else the table earlier runs warmed
        (read afresh: the last generation's timings), else None (new_proposer's default)."""
        if self.pricing is not None:
            return self.pricing.costs
        return warm_costs(self.name, self.given, self.model, self.threads)

    def new(self, costs=None) -> Proposer:
        """A fresh proposer for one generation, drafting by `costs` (default: `costs()`)."""
        return new_proposer(self.k, self.window, self.name, self.llamacpp,
                            self.costs() if costs is None else costs)

    def keep(self, table, note: Note) -> None:
        """Keep the timings of a proposer reading a table (`table`: its CostTable) for the next
        run, unless --costs was given (a home that cannot be written: a note)."""
        if proposer_class(self.name).costs_kind != "table" or self.given is not None \
                or table is None:
            return
        try:
            keep_table(table, self.model.sha256, self.model.numerics,
                       self.threads or get_threads())
        except KolibriError as e:
            note(f"note: the {self.name}'s timings were not kept: {e}")
