"""Draft proposers for speculative decoding: given the context, guess the next few tokens.

Model-free proposers behind one interface (`Proposer`, protocol.py: the methods and the declared
capabilities), each following a published rule (docs/proposers.md), and the registry that names
them. Every proposer computes its draft with cap k and THEN cuts it to the caller's budget, so a
smaller budget gives a prefix of the same draft: the simulation (which knows where a chain ends)
and a real run (which does not) see the same drafts. Both call `begin(prompt_ids)` when a request
starts and, where a proposer `observes`, `observe(context, drafted, accepted)` after every verify
pass, so a stateful proposer evolves identically in both.
Non-goals: verification, acceptance, the KV cache (the speculative generator owns those).
"""

from functools import cache

from kolibri_cli.costs.model import CostTable, ReplayedCosts
from kolibri_cli.decode.proposers import guard, ngram
from kolibri_cli.decode.proposers.adaptive import AdaptiveProposer
from kolibri_cli.decode.proposers.adaptive_tree import AdaptiveTreeProposer
from kolibri_cli.decode.proposers.guard import GuardProposer
from kolibri_cli.decode.proposers.llamacpp import (
    LLAMACPP_DEFAULTS,
    LlamaCppCacheProposer,
    LlamaCppMapK4vProposer,
    LlamaCppMapKProposer,
    LlamaCppModProposer,
    LlamaCppSimpleProposer,
    ngram_mod,
    simple,
)
from kolibri_cli.decode.proposers.ngram import HfProposer, NgramProposer
from kolibri_cli.decode.proposers.protocol import CostsKind, Proposer
from kolibri_cli.decode.proposers.settings import (
    DEFAULT_K,
    DEFAULT_PROPOSER,
    DEFAULT_SPEC_PROPOSER,
    DEFAULT_WINDOW,
    GUARD_K,
    LlamaCppOptions,
    format_window,
    parse_k,
    parse_k_list,
    parse_window,
    parse_window_list,
    validate_k,
    validate_window,
)
from kolibri_cli.decode.proposers.sglang import SglangProposer
from kolibri_cli.decode.proposers.suffix import SuffixProposer, SuffixTreeProposer
from kolibri_cli.decode.proposers.tree import DraftTree
from kolibri_cli.errors import KolibriError

__all__ = [
    "DEFAULT_K", "DEFAULT_PROPOSER", "DEFAULT_SPEC_PROPOSER", "DEFAULT_WINDOW", "GUARD_K",
    "LLAMACPP_DEFAULTS", "PROPOSERS", "AdaptiveProposer", "AdaptiveTreeProposer", "CostsKind",
    "GuardProposer", "HfProposer", "LlamaCppCacheProposer", "LlamaCppMapK4vProposer",
    "LlamaCppMapKProposer", "LlamaCppModProposer", "LlamaCppOptions", "LlamaCppSimpleProposer",
    "NgramProposer", "Proposer", "SglangProposer", "SuffixProposer", "SuffixTreeProposer",
    "DraftTree", "canonical_proposer", "default_settings", "draft", "draft_tree",
    "format_window", "make_proposer", "parse_k", "parse_k_list", "parse_window",
    "parse_window_list", "proposer_class", "reads_cost_table", "validate_k", "validate_window",
]


PROPOSERS: dict[str, type[Proposer]] = {
    "vllm": NgramProposer,
    "hf": HfProposer,
    "llamacpp-simple": LlamaCppSimpleProposer,
    "llamacpp-map-k": LlamaCppMapKProposer,
    "llamacpp-map-k4v": LlamaCppMapK4vProposer,
    "llamacpp-mod": LlamaCppModProposer,
    "llamacpp-cache": LlamaCppCacheProposer,
    "suffix": SuffixProposer,
    "adaptive": AdaptiveProposer,
    "suffix-tree": SuffixTreeProposer,
    "adaptive-tree": AdaptiveTreeProposer,
    "sglang": SglangProposer,
    "guard": GuardProposer,
}
ALIASES = {"ngram": "vllm"}
# (k, window) where a proposer's own defaults differ from kolibri's shared ones; for tree
# proposers k counts tree nodes (sglang: 11, SGLang's default of 12 draft tokens counting the
# root); the guard's k is a wide cap (it chooses each draft's length)
DEFAULTS = LLAMACPP_DEFAULTS | {"sglang": (11, (1, 12)), "suffix-tree": (12, (1, 4)),
                                "adaptive-tree": (16, (1, 4)), "guard": (GUARD_K, DEFAULT_WINDOW)}


def draft(proposer: Proposer, context, budget: int) -> list[int]:
    """The proposer's draft for `context`, at most `budget` tokens: the one call both the
    simulation and the speculative generator make, so an over-drafting proposer fails loudly
    instead of making them disagree."""
    tokens = list(proposer.propose(context, budget))
    if len(tokens) > max(budget, 0):
        raise KolibriError(f"proposer {proposer.name!r} drafted {len(tokens)} tokens with a "
                           f"budget of {budget} (a proposer bug)")
    return tokens


def draft_tree(proposer: Proposer, context, budget: int) -> DraftTree:
    """A tree proposer's draft tree for `context`, no deeper than `budget` (at most k nodes): the
    tree counterpart of `draft`."""
    tree = proposer.propose_tree(context, budget)
    if len(tree) > proposer.k or tree.depth() > max(budget, 0):
        raise KolibriError(f"proposer {proposer.name!r} drafted a tree of {len(tree)} nodes and "
                           f"depth {tree.depth()} (cap {proposer.k}, budget {budget}): a proposer "
                           "bug")
    return tree


def reads_cost_table(name: str) -> bool:
    """Whether proposer `name` decides each draft by a cost table it reads every pass, so a
    simulation under load must run it live at the step's costs."""
    return proposer_class(name).costs_kind == "table"


def proposer_class(name: str) -> type[Proposer]:
    """The registered class of proposer `name` (or an alias): its declared capabilities, for
    questions asked before a proposer exists."""
    return PROPOSERS[canonical_proposer(name)]


@cache
def warm_up() -> None:
    """Compile (a machine's first run) or load from numba's cache the drafting kernels, once per
    process, so neither lands inside the first timed request."""
    ngram.warm_up()
    guard.warm_up()
    simple.warm_up()
    ngram_mod.warm_up()


def default_settings(name: str) -> tuple[int, tuple[int, int]]:
    """(k, window) a proposer runs with when none is given: llama.cpp's types keep upstream's
    defaults, the others share kolibri's."""
    return DEFAULTS.get(canonical_proposer(name), (DEFAULT_K, DEFAULT_WINDOW))


def canonical_proposer(name: str) -> str:
    """The proposer's canonical name ("ngram" -> "vllm"); unknown names are a KolibriError."""
    name = ALIASES.get(name, name)
    if name not in PROPOSERS:
        known = ", ".join([*PROPOSERS, *ALIASES])
        raise KolibriError(f"unknown proposer {name!r}; available: {known}")
    return name


def make_proposer(name: str, k: int, window: tuple[int, int],
                  costs: dict[int, float] | CostTable | ReplayedCosts | None = None,
                  cross_request: bool = False, eos_ids: tuple[int, ...] = (),
                  llamacpp: LlamaCppOptions | None = None) -> Proposer:
    """A fresh proposer called `name` with draft cap k and n-gram window (min, max); `costs` feeds
    `adaptive`, `adaptive-tree` and `guard`, `cross_request` feeds `suffix`, `eos_ids` feeds `hf`,
    `llamacpp` feeds llama.cpp's stateful types (others ignore them). A proposer reading a cost
    table (the guard) given c(n) drafts with them, frozen; without, with the default c(n),
    frozen; given an empty `CostTable()`, with the costs the generator measures into it."""
    name = canonical_proposer(name)
    if PROPOSERS[name].costs_kind == "table":
        return PROPOSERS[name](k, *window, costs=_cost_table(costs))
    if name in LLAMACPP_DEFAULTS and name != "llamacpp-simple":
        return PROPOSERS[name](k, *window, options=llamacpp)
    if name in ("suffix", "suffix-tree"):
        return PROPOSERS[name](k, *window, cross_request=cross_request)
    if name == "adaptive":
        return AdaptiveProposer(k, *window, costs=_cost_dict(costs))
    if name == "adaptive-tree":
        return AdaptiveTreeProposer(k, *window, costs=_cost_dict(costs),
                                    cross_request=cross_request)
    if name == "hf":
        return HfProposer(k, *window, eos_ids=tuple(eos_ids))
    return PROPOSERS[name](k, window[0], window[1])


def _cost_table(costs):
    """A table as given (measuring, frozen or replayed); numbers make a frozen one; none, a
    frozen empty one (the default c(n))."""
    if isinstance(costs, dict):
        return CostTable.from_costs(costs)
    return CostTable(frozen=True) if costs is None else costs


def _cost_dict(costs) -> dict[int, float] | None:
    if not isinstance(costs, dict | None):
        raise KolibriError("adaptive takes c(n) as numbers (--costs), not a measured table")
    return costs


def fit_context(k: int, window_max: int, model) -> None:
    """A draft of k tokens is verified in one pass of k + 1 positions, and an n-gram of n tokens
    must fit the context: larger settings could never be used."""
    context = model.context
    if context is None:  # not known (a server that does not say): the server will refuse
        return
    if k + 1 > context:
        raise KolibriError(f"--k {k} does not fit the model's context ({context} tokens; "
                           f"at most {context - 1})")
    if window_max > context:
        raise KolibriError(f"--window max {window_max} exceeds the model's context "
                           f"({context} tokens)")
