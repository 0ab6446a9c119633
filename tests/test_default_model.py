"""The default model end to end: kolibri's greedy chains equal the float32 transformers reference
recorded in the shipped goldens, speculative output equals plain output on every golden, and
the real spec runs' counts equal the probe's simulation."""

import json

import pytest
from typer.testing import CliRunner

from kolibri_cli.cli import app
from kolibri_cli.decode.generate import generate_plain, generate_spec
from kolibri_cli.decode.proposers import NgramProposer
from kolibri_cli.goldens.chains import DEFAULT_CHAT as CHAT
from kolibri_cli.goldens.chains import load_goldens
from kolibri_cli.goldens.record import check_one
from kolibri_cli.probe.simulate import simulate_chain

pytestmark = pytest.mark.model

GOLDENS = load_goldens(CHAT)
# "What is the capital of France?" through the chat template, greedy, transformers float32
FRANCE_IDS = [504, 3575, 282, 4649, 314, 7042, 30, 2]


@pytest.fixture(scope="session")
def model(pulled_default):
    from kolibri_cli.store.models import open_model

    return open_model(str(pulled_default.path))


@pytest.fixture(scope="session")
def plain_chains(model) -> dict:
    return {g.id: generate_plain(model, g.prompt_ids, len(g.output_ids)) for g in GOLDENS}


def test_goldens_were_recorded_from_this_model(model):
    assert {g.model_sha256 for g in GOLDENS} == {model.sha256}
    assert {g.reference["engine"] for g in GOLDENS} == {"transformers"}


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda g: str(g.id))
def test_greedy_chain_equals_the_float32_reference(model, golden):
    result = check_one(model, golden)
    # identical over all tokens, or diverging only at a reference near-tie (< 1e-3)
    assert result.explained, result


def test_most_chains_are_identical(model, plain_chains):
    identical = sum(plain_chains[g.id].output_ids == g.output_ids for g in GOLDENS)
    assert identical == len(GOLDENS)


@pytest.mark.parametrize("k,window", [(5, (1, 4)), (8, (1, 4)), (3, (2, 2))])
def test_spec_equals_plain_on_every_golden(model, plain_chains, k, window):
    for g in GOLDENS:
        spec = generate_spec(model, g.prompt_ids, len(g.output_ids), NgramProposer(k, *window))
        assert spec.output_ids == plain_chains[g.id].output_ids, g.id
        sim = simulate_chain(g.prompt_ids, plain_chains[g.id].output_ids,
                             NgramProposer(k, *window), k)
        stats = spec.spec_stats()
        assert (stats["verify_passes"], stats["drafts_proposed"], stats["drafts_accepted"]) == (
            sim.verify_passes, sim.drafts_proposed, sim.drafts_accepted), g.id


def test_generate_json_on_the_default_model(pulled_default, monkeypatch):
    monkeypatch.setenv("KOLIBRI_HOME", str(pulled_default.home))
    result = CliRunner().invoke(app, ["generate", "--json", "What is the capital of France?"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["output_ids"] == FRANCE_IDS
    assert doc["text"] == "The capital of France is Paris."
    assert doc["mode"] == "plain" and doc["stats"]["new_tokens"] == len(FRANCE_IDS)
    assert doc["stats"]["forward_passes"] == len(FRANCE_IDS)


def test_generate_spec_json_on_the_default_model(pulled_default, monkeypatch):
    monkeypatch.setenv("KOLIBRI_HOME", str(pulled_default.home))
    args = ["generate", "--json", "--spec", "--k", "3", "--window", "2", "-n", "40",
            "Repeat exactly: one two three, one two three, one two three"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["mode"] == "spec" and doc["k"] == 3 and doc["window"] == [2, 2]
    stats = doc["stats"]
    assert stats["drafts_accepted"] > 0
    assert sum(stats["accepted_per_position"]) == stats["drafts_accepted"]
    assert stats["verify_passes"] == stats["forward_passes"] - 1


def test_measured_probe_counts_equal_simulation_on_smoke_goldens(pulled_default, monkeypatch):
    """`kolibri probe --measure`: the real spec run's counts equal the simulated ones, spec ==
    plain, and the model's plain chain equals the golden (no timing is asserted)."""
    monkeypatch.setenv("KOLIBRI_HOME", str(pulled_default.home))
    goldens = CHAT
    args = ["probe", "--goldens", str(goldens), "--limit", "3", "--max-tokens", "48",
            "--measure", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    run = json.loads(result.stdout)["runs"][0]
    measured = run["measured"]
    assert measured["spec_equals_plain"] and measured["counts_match_simulation"]
    for sim, real in zip(run["goldens"], measured["goldens"], strict=True):
        assert real["first_divergence"] is None
        assert (real["verify_passes"], real["drafts_proposed"], real["drafts_accepted"]) == (
            sim["verify_passes"], sim["drafts_proposed"], sim["drafts_accepted"])
    assert set(measured["costs"]) == {"1", "2", "3", "4", "5", "6"}
