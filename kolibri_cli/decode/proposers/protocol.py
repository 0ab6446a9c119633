"""The proposer interface, said once: what every proposer does, and the capabilities it declares.

Callers read a proposer's declared capabilities (`trees`, `observes`, `shares_state`,
`costs_kind`, `llama_server`) and never probe for methods. Every registered proposer subclasses
`Proposer` explicitly, so it inherits the defaults below (no capability, no-op `begin` and
`observe`); a class that does more says so by overriding them. Before a proposer exists, the
same questions go to its registered class (`proposer_class(name)` in the package).
"""

from typing import ClassVar, Literal, Protocol, runtime_checkable

from kolibri_cli.costs.model import CostTable, ReplayedCosts
from kolibri_cli.decode.proposers.tree import DraftTree

# How a proposer takes c(n): None = it drafts without them; "numbers" = c(n) given at
# construction (a dict, e.g. `--costs` or a bench's); "table" = a CostTable it reads every pass
# (at the running context length) and that the generator may time forwards into.
CostsKind = Literal["numbers", "table"] | None


@runtime_checkable
class Proposer(Protocol):
    """Anything that drafts tokens from the context alone."""

    name: ClassVar[str]  # the registry's name for it
    k: int  # draft cap (a tree's: nodes)
    window_min: int  # n-gram sizes tried
    window_max: int

    trees: ClassVar[bool] = False  # drafts trees (`propose_tree`): several candidates per pass
    observes: ClassVar[bool] = False  # learns from each pass's outcome (`observe`)
    # its drafts depend on earlier requests, so requests must pass through one instance in
    # order; the safe default for a proposer that does not say
    shares_state: bool = True
    costs_kind: ClassVar[CostsKind] = None  # how it takes c(n) (see CostsKind)
    costs: dict[int, float] | CostTable | ReplayedCosts | None = None  # the c(n) it drafts by
    # the llama-server `--spec-type` that runs the same rule (None: llama-server has none)
    llama_server: ClassVar[str | None] = None

    def propose(self, context, max_tokens: int) -> list[int]:
        """Draft at most `max_tokens` tokens to follow `context` (prompt + generated ids)."""
        ...

    def propose_tree(self, context, max_depth: int) -> DraftTree:
        """A tree proposer's draft tree for `context`, no deeper than `max_depth`, at most k
        nodes (only where `trees`)."""
        raise NotImplementedError(f"proposer {self.name!r} drafts chains, not trees")

    def begin(self, prompt_ids) -> None:
        """A request starts with these prompt ids (before its first token): proposers that keep
        state across requests the way a server does (llama.cpp's types, sglang) take note."""

    def observe(self, context, drafted: int, accepted: int) -> None:
        """How the last pass went (only where `observes`): `context` as it stands after it,
        `drafted` drafts verified, the first `accepted` of them accepted. Called after every
        verify pass by both the simulation and the speculative generator, so a stateful
        proposer evolves identically in both."""
