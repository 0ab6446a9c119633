"""Draft proposers for speculative decoding: given the context, guess the next few tokens.

Model-free proposers behind one tiny interface (`Proposer`), each following a published rule
(docs/probe.md, "Proposers"). Every proposer computes its draft with cap k and THEN cuts it to the
caller's budget, so a smaller budget gives a prefix of the same draft: the simulation (which knows
where a chain ends) and a real run (which does not) see the same drafts. Stateful proposers also
have `observe(context, drafted, accepted)`, called after every verify pass by both the simulation
and the speculative generator, so they evolve identically in both.
Non-goals: verification, acceptance, the KV cache (the speculative generator owns those).
"""

from typing import Protocol, runtime_checkable

from kolibri_cli.decode.proposers.adaptive import AdaptiveProposer
from kolibri_cli.decode.proposers.llamacpp import LlamaCppSimpleProposer
from kolibri_cli.decode.proposers.ngram import HfProposer, NgramProposer
from kolibri_cli.decode.proposers.settings import (
    DEFAULT_K,
    DEFAULT_PROPOSER,
    DEFAULT_WINDOW,
    format_window,
    parse_k,
    parse_k_list,
    parse_window,
    parse_window_list,
    validate_k,
    validate_window,
)
from kolibri_cli.decode.proposers.suffix import SuffixProposer
from kolibri_cli.errors import KolibriError

__all__ = [
    "DEFAULT_K", "DEFAULT_PROPOSER", "DEFAULT_WINDOW", "PROPOSERS", "AdaptiveProposer",
    "HfProposer", "LlamaCppSimpleProposer", "NgramProposer", "Proposer", "SuffixProposer",
    "canonical_proposer", "draft", "format_window", "make_proposer", "parse_k", "parse_k_list",
    "parse_window", "parse_window_list", "shares_state", "validate_k", "validate_window",
]


@runtime_checkable
class Proposer(Protocol):
    """Anything that drafts tokens from the context alone."""

    name: str
    k: int

    def propose(self, context, max_tokens: int) -> list[int]:
        """Draft at most `max_tokens` tokens to follow `context` (prompt + generated ids)."""
        ...


def shares_state(proposer: Proposer) -> bool:
    """True when a proposer's drafts depend on earlier requests (state kept across them), so
    requests must pass through one instance in order; a proposer says False with a
    `shares_state` attribute, and one that does not say is taken to share."""
    return bool(getattr(proposer, "shares_state", True))


PROPOSERS = {
    "vllm": NgramProposer,
    "hf": HfProposer,
    "llamacpp-simple": LlamaCppSimpleProposer,
    "suffix": SuffixProposer,
    "adaptive": AdaptiveProposer,
}
ALIASES = {"ngram": "vllm"}


def draft(proposer: Proposer, context, budget: int) -> list[int]:
    """The proposer's draft for `context`, at most `budget` tokens: the one call both the
    simulation and the speculative generator make, so an over-drafting proposer fails loudly
    instead of making them disagree."""
    tokens = list(proposer.propose(context, budget))
    if len(tokens) > max(budget, 0):
        raise KolibriError(f"proposer {proposer.name!r} drafted {len(tokens)} tokens with a "
                           f"budget of {budget} (a proposer bug)")
    return tokens


def canonical_proposer(name: str) -> str:
    """The proposer's canonical name ("ngram" -> "vllm"); unknown names are a KolibriError."""
    name = ALIASES.get(name, name)
    if name not in PROPOSERS:
        known = ", ".join([*PROPOSERS, *ALIASES])
        raise KolibriError(f"unknown proposer {name!r}; available: {known}")
    return name


def make_proposer(name: str, k: int, window: tuple[int, int],
                  costs: dict[int, float] | None = None, cross_request: bool = False,
                  eos_ids: tuple[int, ...] = ()) -> Proposer:
    """A fresh proposer called `name` with draft cap k and n-gram window (min, max); `costs` feeds
    `adaptive`, `cross_request` feeds `suffix`, `eos_ids` feeds `hf` (others ignore them)."""
    name = canonical_proposer(name)
    if name == "suffix":
        return SuffixProposer(k, *window, cross_request=cross_request)
    if name == "adaptive":
        return AdaptiveProposer(k, *window, costs=costs)
    if name == "hf":
        return HfProposer(k, *window, eos_ids=tuple(eos_ids))
    return PROPOSERS[name](k, window[0], window[1])
