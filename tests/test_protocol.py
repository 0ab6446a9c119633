"""The proposer interface: every registered proposer subclasses `Proposer` and declares its
capabilities consistently with what it implements, so callers may read them instead of probing."""

import pytest

from kolibri_cli.costs.model import CostTable
from kolibri_cli.decode.proposers import (
    ALIASES,
    PROPOSERS,
    NgramProposer,
    Proposer,
    default_settings,
    make_proposer,
    proposer_class,
    reads_cost_table,
)
from kolibri_cli.errors import KolibriError

NAMES = list(PROPOSERS)


def overrides(cls: type, method: str) -> bool:
    """Whether `cls` implements `method` itself rather than taking the Protocol's default."""
    return getattr(cls, method) is not getattr(Proposer, method)


@pytest.mark.parametrize("name", NAMES)
def test_each_proposer_subclasses_the_protocol_under_its_registered_name(name):
    cls = PROPOSERS[name]
    assert Proposer in cls.__mro__ and cls.name == name
    assert isinstance(make_proposer(name, *default_settings(name)), Proposer)


@pytest.mark.parametrize("name", NAMES)
def test_trees_and_observes_say_what_the_class_implements(name):
    cls = PROPOSERS[name]
    assert cls.trees == overrides(cls, "propose_tree"), name
    assert cls.observes == overrides(cls, "observe"), name


@pytest.mark.parametrize("name", NAMES)
def test_each_proposer_says_whether_it_shares_state(name):
    """Not left to the default (share: the safe guess for a proposer that does not say)."""
    cls = PROPOSERS[name]
    assert any("shares_state" in c.__dict__ for c in cls.__mro__[: cls.__mro__.index(Proposer)])


@pytest.mark.parametrize("name", NAMES)
def test_costs_kind_says_how_the_proposer_takes_c_of_n(name):
    """Given c(n) as numbers, a "numbers" proposer drafts by them as given, a "table" one reads a
    frozen table of them, and one without a kind takes none."""
    given = {1: 1.0, 2: 1.2}
    proposer = make_proposer(name, *default_settings(name), costs=given)
    kind = PROPOSERS[name].costs_kind
    if kind == "numbers":
        assert proposer.costs == given
    elif kind == "table":
        assert isinstance(proposer.costs, CostTable) and proposer.costs.frozen
        assert proposer.costs.relative(10, 2)[2] == pytest.approx(1.2)
    else:
        assert kind is None and proposer.costs is None
    assert reads_cost_table(name) == (kind == "table")


@pytest.mark.parametrize("name", NAMES)
def test_llama_server_names_the_spec_type_the_proposer_starts(name):
    cls = PROPOSERS[name]
    assert ("server_args" in dir(cls)) == (cls.llama_server is not None)
    if cls.llama_server is not None:
        args = make_proposer(name, *default_settings(name)).server_args()
        assert args[:2] == ("--spec-type", cls.llama_server)


def test_capabilities_by_name_go_through_the_registry():
    assert proposer_class("ngram") is NgramProposer and set(ALIASES.values()) <= set(PROPOSERS)
    assert [n for n in NAMES if reads_cost_table(n)] == ["guard"]
    assert [n for n in NAMES if PROPOSERS[n].costs_kind == "numbers"] == ["adaptive",
                                                                           "adaptive-tree"]
    with pytest.raises(KolibriError, match="unknown proposer 'eagle'"):
        proposer_class("eagle")


def test_a_chain_proposer_has_no_tree_to_give():
    with pytest.raises(NotImplementedError, match="'vllm' drafts chains"):
        make_proposer("vllm", 5, (1, 4)).propose_tree([1, 2, 1], 3)
