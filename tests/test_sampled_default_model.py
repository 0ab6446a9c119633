"""The default model sampled at T = 0.7: goldens recorded with 3 seeds (tests/data, the first 48
ids of `kolibri goldens record --prompts kolibri_cli/goldens/data/prompts/chat.jsonl --engine
kolibri --temperature 0.7 --seed 0 --seeds 3 -n 128`) are reproduced exactly by the plain and the
speculative generator, and the real spec runs' counts equal the simulation's."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kolibri_cli.cli import app
from kolibri_cli.decode.generate import generate_plain, generate_spec
from kolibri_cli.decode.proposers import NgramProposer
from kolibri_cli.goldens.chains import load_goldens
from kolibri_cli.probe.simulate import simulate_chain

pytestmark = pytest.mark.model

SAMPLED = Path(__file__).parent / "data" / "chat-t0.7-48.jsonl"
GOLDENS = load_goldens(SAMPLED)


@pytest.fixture(scope="module")
def model(pulled_default):
    from kolibri_cli.store.models import open_model

    return open_model(str(pulled_default.path))


def test_the_file_is_three_seeds_at_t07():
    assert {g.seed for g in GOLDENS} == {0, 1, 2}
    assert {g.sampling["temperature"] for g in GOLDENS} == {0.7}


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda g: str(g.id))
def test_sampled_spec_equals_plain_equals_golden(model, golden):
    n, s = len(golden.output_ids), golden.sampler
    plain = generate_plain(model, golden.prompt_ids, n, sampling=s)
    spec = generate_spec(model, golden.prompt_ids, n, NgramProposer(5, 1, 4), sampling=s)
    assert plain.output_ids == golden.output_ids
    assert spec.output_ids == golden.output_ids
    sim = simulate_chain(golden.prompt_ids, golden.output_ids, NgramProposer(5, 1, 4), 5)
    stats = spec.spec_stats()
    assert (stats["verify_passes"], stats["drafts_proposed"], stats["drafts_accepted"]) == (
        sim.verify_passes, sim.drafts_proposed, sim.drafts_accepted)


def test_sampled_drafts_are_accepted_on_the_default_model():
    total = sum(simulate_chain(g.prompt_ids, g.output_ids, NgramProposer(5, 1, 4), 5)
                .drafts_accepted for g in GOLDENS)
    assert total > 100


def test_generate_compare_sampled(pulled_default, monkeypatch):
    monkeypatch.setenv("KOLIBRI_HOME", str(pulled_default.home))
    args = ["generate", "--temperature", "0.7", "--seed", "3", "--spec", "--compare", "--json",
            "-n", "40", "List the days of the week, then list them again in the same order."]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["identical"] and doc["plain"]["sampling"]["seed"] == 3
    assert doc["spec"]["output_ids"] == doc["plain"]["output_ids"]
