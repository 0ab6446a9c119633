"""What a command drafts with (decode/drafting.py): each choice made by the proposer's declared
`costs_kind`. The commands' end-to-end behaviour is in test_generate_pricing.py."""

from types import SimpleNamespace

import pytest

from kolibri_cli.costs.model import CostTable
from kolibri_cli.decode import drafting
from kolibri_cli.errors import KolibriError

MODEL = SimpleNamespace(name="m", sha256="0" * 64, numerics="float32")


def test_costs_are_asked_only_of_proposers_that_take_them():
    assert drafting.asked_costs(None, "vllm") is None
    assert drafting.asked_costs("1,1.2", "guard").costs == {1: 1.0, 2: 1.2}
    assert drafting.asked_costs("default", "adaptive-tree").source == "guess"
    with pytest.raises(KolibriError, match="--costs prices adaptive, adaptive-tree and guard; "
                                           "--proposer ngram drafts without c"):
        drafting.asked_costs("1,1.2", "ngram")


def test_pricing_by_costs_kind(kolibri_home):
    notes = []
    given = drafting.asked_costs("1,1.2", "adaptive")
    assert drafting.pricing("vllm", given, MODEL, notes.append) is None  # takes no c(n)
    assert drafting.pricing("guard", given, MODEL, notes.append) is given  # numbers: frozen
    guess = drafting.asked_costs("default", "guard")
    assert drafting.pricing("guard", guess, MODEL, notes.append) is None  # times its own
    assert drafting.pricing("adaptive", given, MODEL, notes.append) is given
    assert notes == []
    chosen = drafting.pricing("adaptive", None, MODEL, notes.append)  # nothing benched: guess
    assert chosen.source == "guess" and notes == [chosen.note]


def test_only_a_table_reader_warms_and_keeps_its_timings(kolibri_home):
    assert drafting.warm_costs("adaptive", None, MODEL, 2) is None
    given = drafting.asked_costs("default", "guard")
    assert drafting.warm_costs("guard", given, MODEL, 2) is None  # --costs default: starts cold
    guard = drafting.new_proposer(None, None, "guard",
                                  costs=drafting.warm_costs("guard", None, MODEL))
    assert guard.costs.cells() == []  # nothing kept yet
    for rows, seconds in ((1, 0.01), (1, 0.01), (3, 0.012)):
        guard.costs.add(rows, 100, seconds)
    notes = []
    asked = drafting.Drafting.checked(None, None, "guard", costs="default").for_model(
        MODEL, notes.append, 2)
    asked.keep(guard.costs, notes.append)  # --costs given: nothing kept
    assert drafting.warm_costs("guard", None, MODEL).cells() == []
    drafting.Drafting.checked(None, None, "guard").for_model(MODEL, notes.append, 2).keep(
        guard.costs, notes.append)
    assert drafting.warm_costs("guard", None, MODEL, 2).cells() == guard.costs.cells() != []
    assert notes == []


def test_one_set_up_drafts_as_the_options_and_the_model_say(kolibri_home):
    """Drafting: bad settings refused before a model loads; then each generation's proposer
    drafts by the chosen c(n) (numbers), or by the table the last generation kept (a table)."""
    with pytest.raises(KolibriError, match="--k must be at least 1"):
        drafting.Drafting.checked(0, None, "guard")
    with pytest.raises(KolibriError, match="drafts without c"):
        drafting.Drafting.checked(None, None, "ngram", costs="1,1.2")
    notes = []
    adaptive = drafting.Drafting.checked(2, "1-3", "adaptive", costs="1,1.2").for_model(
        MODEL, notes.append)
    proposer = adaptive.new()
    assert (proposer.name, proposer.k, adaptive.pricing.source) == ("adaptive", 2, "given")
    assert proposer.costs == {1: 1.0, 2: 1.2} and notes == []
    guard = drafting.Drafting.checked(None, None, "guard").for_model(MODEL, notes.append, 2)
    first = guard.new()
    assert guard.pricing is None and first.costs.cells() == []
    for rows, seconds in ((1, 0.01), (1, 0.01), (3, 0.012)):
        first.costs.add(rows, 100, seconds)
    guard.keep(first.costs, notes.append)
    assert guard.new().costs.cells() == first.costs.cells() != []  # the next answer starts warm
    assert notes == []


def test_bench_proposers_draft_by_the_run_s_costs_or_their_own():
    measured = {1: 1.0, 2: 1.3}
    assert drafting.bench_proposers(None, None, "adaptive", None)(measured).costs is measured
    guard = drafting.bench_proposers(None, None, "guard", None)(measured).costs
    assert isinstance(guard, CostTable) and not guard.frozen  # measures, as in generate
    assert drafting.bench_proposers(None, None, "vllm", None)(measured).costs is None
