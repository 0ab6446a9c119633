"""`kolibri probe --where EXPR`: numexpr over the goldens' columns, the same slice in memory and
read piece by piece, one error line for a bad expression."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from kolibri_cli.cli import app
from kolibri_cli.goldens.chains import SHIPPED_GOLDENS
from kolibri_cli.goldens.stream import find_golden_files, iter_goldens
from kolibri_cli.probe import where as where_mod
from kolibri_cli.probe.config import ProbeConfig, select_goldens
from kolibri_cli.probe.replay.shards import plan_tasks, run_task
from kolibri_cli.probe.where import parse_where

SHIPPED = list(iter_goldens(find_golden_files([SHIPPED_GOLDENS])))
EXPRESSIONS = {  # the expression, and the same condition in Python
    "output_tokens >= 100 & category != 'chat'":
        lambda g: len(g.output_ids) >= 100 and g.category != "chat",
    "prompt_tokens * 2 < output_tokens | category == 'code'":
        lambda g: len(g.prompt_ids) * 2 < len(g.output_ids) or g.category == "code",
    "chat == 1 & temperature == 0 & ~(output_tokens >= 60)": lambda g: g.chat and
        float(g.sampling.get("temperature") or 0) == 0 and not len(g.output_ids) >= 60,
    "prompt_tokens - output_tokens > -20 and prompt_tokens < 120":
        lambda g: len(g.prompt_ids) - len(g.output_ids) > -20 and len(g.prompt_ids) < 120,
}


def run(*args):
    return CliRunner().invoke(app, ["probe", *map(str, args)])


@pytest.mark.parametrize("text", EXPRESSIONS)
def test_the_mask_is_the_condition_on_every_golden_across_batches(text, monkeypatch):
    monkeypatch.setattr(where_mod, "BATCH", 5)  # several batches and a short last one
    want = [g.id for g in SHIPPED if EXPRESSIONS[text](g)]
    assert 0 < len(want) < len(SHIPPED)  # a slice, not all or nothing
    assert [g.id for g in parse_where(text).select(SHIPPED)] == want
    mask = parse_where(text).mask(SHIPPED)
    assert mask.dtype == np.bool_ and mask.shape == (len(SHIPPED),)


@pytest.mark.parametrize("text", EXPRESSIONS)
def test_read_in_pieces_it_selects_what_it_selects_in_memory(text):
    cfg = ProbeConfig(goldens=[SHIPPED_GOLDENS], where=text, k=[3])
    in_memory = select_goldens(cfg)
    tasks = plan_tasks(cfg, piece_bytes=4096)
    assert len(tasks) > 2  # several pieces, each filtered on its own
    assert sum(run_task(t).shares[0].chains for t in tasks) == len(in_memory)
    limited = ProbeConfig(goldens=[SHIPPED_GOLDENS], where=text, k=[3], limit=2)
    assert [g.id for g in select_goldens(limited)] == [g.id for g in in_memory[:2]]
    tasks = plan_tasks(limited, piece_bytes=4096)
    assert sum(run_task(t).shares[0].chains for t in tasks) == 2


def test_the_verdict_names_the_slice_and_the_counts_are_the_categorys():
    by_where = run("--where", "category == 'code'", "--k", "3", "--json")
    by_category = run("--category", "code", "--k", "3", "--json")
    assert by_where.exit_code == 0, by_where.stderr
    doc, same = json.loads(by_where.stdout), json.loads(by_category.stdout)
    assert doc["runs"][0]["total"] == same["runs"][0]["total"]
    assert doc["config"]["where"] == "category == 'code'"
    assert "where category == 'code'" in doc["verdict"]["text"]
    assert same["config"]["where"] is None and " where " not in same["verdict"]["text"]


def test_probe_toml_takes_where(tmp_path):
    toml = tmp_path / "probe.toml"
    toml.write_text(f'goldens = "{SHIPPED_GOLDENS}"\nwhere = "output_tokens < 40"\nk = 2\n')
    doc = json.loads(run(toml, "--json").stdout)
    assert doc["runs"][0]["chains"] == sum(len(g.output_ids) < 40 for g in SHIPPED)
    toml.write_text('where = "tokens < 40"\n')
    assert "--where 'tokens < 40' names 'tokens'" in run(toml).stderr


@pytest.mark.parametrize(("text", "message"), [
    ("", "is empty"),
    ("foo > 1", "names 'foo'; it may name prompt_tokens, output_tokens, category"),
    ("__import__('os').system('true')", "only columns, numbers, comparisons"),
    ("output_tokens.real > 1", "only columns, numbers, comparisons"),
    ("category > 'a'", "a quoted name compares with == or != to category"),
    ("category + 1 > 2", "category is text"),
    ("category == 'a\\'b'", "is not a name"),
    ("output_tokens", "is not a condition"),
    ("output_tokens > 1e9", "numbers must lie within"),
    ("output_tokens >= 100 &", "is not an expression"),
    ("-(category == 'a') < 1", "numexpr cannot evaluate it"),
    ("output_tokens / 0 > 1", "numexpr cannot evaluate it"),
    ("output_tokens > 1000000", "no goldens where output_tokens > 1000000"),
])
def test_a_bad_where_is_one_error_line(text, message):
    result = run("--where", text)
    assert (result.exit_code, result.stdout) == (1, "")
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert "Traceback" not in result.stderr
