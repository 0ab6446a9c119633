"""The default model sampled at T = 0.7: goldens recorded with 3 seeds (tests/data, the first 48
ids of `kolibri goldens record --prompts goldens/prompts/chat.jsonl --engine
kolibri --temperature 0.7 --seed 0 --seeds 3 -n 128`) are reproduced exactly by the plain and the
speculative generator, and the real spec runs' counts equal the simulation's."""

import json
from pathlib import Path

import pytest
from conftest import LEAN
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
    """The float32 path the goldens were recorded on (kolibri's own chains of one path; the
    default path's sampled spec == plain: test_generate_compare_sampled)."""
    from kolibri_cli.store.models import open_model

    return open_model(str(pulled_default.path), numerics="float32", kernels=LEAN)


def test_the_file_is_three_seeds_at_t07():
    assert {g.seed for g in GOLDENS} == {0, 1, 2}
    assert {g.sampling["temperature"] for g in GOLDENS} == {0.7}


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda g: str(g.id))
def test_sampled_plain_equals_golden(model, golden):
    plain = generate_plain(model, golden.prompt_ids, len(golden.output_ids),
                           sampling=golden.sampler)
    assert plain.output_ids == golden.output_ids


def prompt_index(golden) -> int:
    return PROMPTS.index(str(golden.id).split("/")[0])


PROMPTS = list(dict.fromkeys(str(g.id).split("/")[0] for g in GOLDENS))
# every prompt once, its seeds taking turns: each seed on 6 prompts
SPEC = [g for g in GOLDENS if g.seed == prompt_index(g) % 3]


@pytest.mark.parametrize("golden", SPEC, ids=lambda g: str(g.id))
def test_sampled_spec_equals_plain(model, golden):
    """spec == plain: the spec chain equals the golden, which the plain chain equals (above),
    and the spec run's counts equal the simulation's. On every prompt at one seed rather than
    all three: the seeds take the same code path (noise keyed by seed and position, the same in
    both generators) and SPEC exercises it (test_sampled_drafts_are_accepted_...)."""
    spec = generate_spec(model, golden.prompt_ids, len(golden.output_ids), NgramProposer(5, 1, 4),
                         sampling=golden.sampler)
    assert spec.output_ids == golden.output_ids
    sim = simulate_chain(golden.prompt_ids, golden.output_ids, NgramProposer(5, 1, 4), 5)
    stats = spec.spec_stats()
    assert (stats["verify_passes"], stats["drafts_proposed"], stats["drafts_accepted"]) == (
        sim.verify_passes, sim.drafts_proposed, sim.drafts_accepted)


def test_sampled_drafts_are_accepted_on_the_default_model():
    """The spec runs above see drafts accepted at every position and drafts rejected."""
    sims = [simulate_chain(g.prompt_ids, g.output_ids, NgramProposer(5, 1, 4), 5) for g in SPEC]
    assert len(SPEC) == len(PROMPTS) == 18 and {g.seed for g in SPEC} == {0, 1, 2}
    assert sum(s.drafts_accepted for s in sims) > 100
    assert all(sum(s.accepted_at[i] for s in sims) > 0 for i in range(5))
    assert sum(s.drafts_proposed - s.drafts_accepted for s in sims) > 0


def test_generate_compare_sampled(pulled_default, monkeypatch):
    monkeypatch.setenv("KOLIBRI_HOME", str(pulled_default.home))
    args = ["generate", "--temperature", "0.7", "--seed", "3", "--spec", "--compare", "--json",
            "--costs", "default",  # a cold guard, no timings kept in the session's shared home
            "-n", "40", "List the days of the week, then list them again in the same order."]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["identical"] and doc["plain"]["sampling"]["seed"] == 3
    assert doc["spec"]["output_ids"] == doc["plain"]["output_ids"]
