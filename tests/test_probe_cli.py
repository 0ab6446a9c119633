"""`kolibri probe` through CliRunner: exit codes, the --json schema, gates, files, PROBE.toml."""

import json
import re
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kolibri_cli.cli import app
from kolibri_cli.costs.model import GUESS_HOST
from kolibri_cli.probe import config as probe_config

# Hand-computed at k=3 window 1-2 (tests/test_simulate.py): "mix" 7 steps in 3 passes, drafts
# [3, 0, 2] with [2, 0, 2] accepted; "rej" 2 steps in 2 passes, 1 draft, 0 accepted.
CHAINS = [
    ("mix", "code", [1, 2, 3, 4, 5], [1, 2, 3, 9, 1, 2, 3, 4]),
    ("rej", "qa", [1, 2, 3], [1, 9, 9]),
]


def run(*args):
    return CliRunner().invoke(app, ["probe", *map(str, args)])


@pytest.fixture
def goldens(tmp_path):
    path = tmp_path / "g.jsonl"
    lines = [
        {"id": gid, "category": cat, "prompt": "p", "chat": True, "prompt_ids": p,
         "output_ids": g, "model": "m", "model_sha256": "0" * 64, "reference": {}}
        for gid, cat, p, g in CHAINS
    ]  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


# c(1..4) given, so every speedup is fixed by hand: "mix" 7 steps in passes of 1 + [3, 0, 2]
# rows, 7 / (1.3 + 1 + 1.2) = 2.0x; "rej" 2 steps in passes of 1 + [1, 0], 2 / 2.1 = 0.95x;
# together 9 / 5.6 = 1.61x, the interval over resamples of the two from 0.95x to 2.0x.
COSTS = "1,1.1,1.2,1.3"


def test_json_schema_and_values(goldens):
    result = run("--goldens", goldens, "--k", "3", "--window", "1-2", "--json", "--costs", COSTS)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert set(doc) == {"schema_version", "verdict", "best", "ranking", "categories", "gates",
                        "gate_failures", "throughput", "config", "pricing", "comparison", "runs",
                        "guard", "load"}
    assert doc["schema_version"] == 2 and doc["guard"] is None  # nothing measured
    assert doc["load"] is None  # no --concurrency
    assert doc["config"]["k"] == [3] and doc["config"]["window"] == ["1-2"]
    assert (doc["throughput"]["chains"], doc["throughput"]["steps"]) == (2, 9)
    (r,) = doc["runs"]
    speedup = r["predicted_speedup"]
    assert doc["best"] == {
        "proposer": "vllm", "k": 3, "window": [1, 2], "name": "vllm k=3 window=1-2",
        "speedup": speedup, "basis": "predicted", "predicted_speedup": speedup,
        "measured_speedup": None, "interval": doc["best"]["interval"], "goldens_faster":
        doc["best"]["goldens_faster"], "goldens": 2, "worst": doc["best"]["worst"], "ratio": 1.8}
    assert speedup == pytest.approx(9 / 5.6)
    assert doc["best"]["interval"] == pytest.approx([2 / 2.1, 2.0])
    assert doc["best"]["worst"] == {"id": "rej", "speedup": pytest.approx(2 / 2.1)}
    assert doc["ranking"] == [doc["best"]] and doc["verdict"]["setting"] == doc["best"]
    low, high = doc["best"]["interval"]
    assert doc["verdict"]["answer"] == "too few goldens" and doc["verdict"]["goldens"] == 2
    assert doc["verdict"]["text"].startswith("n-gram speculation: too few goldens here (2, ")
    assert doc["verdict"]["spread"] is None and doc["verdict"]["interval"] == [low, high]
    head = (r["proposer"], r["k"], r["window"], r["best"], r["measured"], r["chains"])
    assert head == ("vllm", 3, [1, 2], True, None, 2)
    assert r["total"] == {
        "plain_steps": 9, "verify_passes": 5, "ratio": 1.8, "drafts_proposed": 6,
        "drafts_accepted": 4, "passes_with_drafts": 3, "acceptance_rate": 4 / 6,
        "mean_acceptance_length": 1 + 4 / 3, "drafted_at": [3, 2, 1], "accepted_at": [2, 2, 0],
        "accepted_per_position": [2 / 3, 1.0, 0.0],
    }  # fmt: skip
    mix, rej = r["goldens"]
    assert (mix["id"], mix["category"], mix["verify_passes"]) == ("mix", "code", 3)
    assert mix["ratio"] == 7 / 3
    assert mix["draft_lengths"] == [3, 0, 2] and mix["accepted_lengths"] == [2, 0, 2]
    assert (rej["id"], rej["drafts_proposed"], rej["drafts_accepted"]) == ("rej", 1, 0)
    assert r["categories"]["qa"]["plain_steps"] == 2 and r["categories"]["code"]["plain_steps"] == 7


def test_sweep_json_marks_the_best(goldens):
    result = run("--goldens", goldens, "--k", "1,3", "--window", "1-2,3", "--json")
    assert result.exit_code == 0, result.stderr
    runs = json.loads(result.stdout)["runs"]
    grid = [(r["k"], r["window"]) for r in runs]
    assert grid == [(1, [1, 2]), (1, [3, 3]), (3, [1, 2]), (3, [3, 3])]
    assert [r["best"] for r in runs] == [False, False, True, False]
    assert runs[3]["total"]["verify_passes"] == 9  # no 3-gram repeats: every pass is plain
    ranked = json.loads(result.stdout)["ranking"]
    assert [x["speedup"] for x in ranked] == sorted((r["speedup"] for r in runs), reverse=True)


def test_tables_by_default(goldens):
    result = run("--goldens", goldens, "--k", "1,3", "--window", "1-2", "--by-category")
    assert result.exit_code == 0, result.stderr
    for text in ("per golden", "total (2)", "1.80x", "★", "per category", "acceptance per draft"):
        assert text in result.stdout


def test_gates(goldens, kolibri_home, no_throughput_line):
    ok = run("--goldens", goldens, "--k", "3", "--window", "1-2", "--min-ratio", "1.5", "--json")
    guess = f"note: c(n) is a guess (the default model's on {GUESS_HOST}): no kolibri " \
        "bench of m stored: `kolibri bench -m m` measures this host\n"
    assert ok.exit_code == 0 and ok.stderr == guess  # nothing else: no bench for model "m"
    bad = run("--goldens", goldens, "--k", "3", "--window", "1-2", "--min-ratio", "2",
              "--min-acceptance", "0.5", "--json")  # fmt: skip
    assert bad.exit_code == 1
    assert json.loads(bad.stdout)["runs"][0]["total"]["ratio"] == 1.8  # the report still prints
    assert bad.stderr == guess + \
        "error: gate failed: ratio 1.800 < min-ratio 2 (vllm k=3 window=1-2)\n"
    low = run("--goldens", goldens, "--k", "3", "--window", "1-2", "--min-acceptance", "0.7")
    assert low.exit_code == 1
    assert "acceptance rate 0.667 < min-acceptance 0.7 (vllm k=3 window=1-2)" in low.stderr


def test_steep_costs_give_the_verdict_does_not_pay(tmp_path):
    """c(n) = n: "mix" 7 / 8 = 0.875x, "rej" 2 / 3 = 0.67x; three copies of each (a verdict
    needs 5 goldens), so every resample's speedup lies in [2/3, 7/8], wholly below 1.0x."""
    path = tmp_path / "g6.jsonl"
    path.write_text("".join(json.dumps({
        "id": f"{gid}-{i}", "category": cat, "prompt": "p", "chat": True, "prompt_ids": p,
        "output_ids": g, "model": "m", "model_sha256": "0" * 64, "reference": {}}) + "\n"
        for i in range(3) for gid, cat, p, g in CHAINS))
    result = run("--goldens", path, "--k", "3", "--window", "1-2", "--json", "--costs",
                 "1,2,3,4")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["best"]["speedup"] == pytest.approx(9 / 11)
    low, high = doc["best"]["interval"]
    assert 2 / 3 - 1e-9 <= low <= high <= 7 / 8 + 1e-9
    assert doc["verdict"]["answer"] == "does not pay" and doc["verdict"]["goldens"] == 6


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--k", "0"], "k must be a whole number in 1..1024"),
        (["--window", "4-1"], "window 4-1 is invalid"),
        (["--window", "a-b"], "window 'a-b' is invalid"),
        (["--proposer", "eagle"], "unknown proposer 'eagle'"),
        (["--min-acceptance", "1.5"], "min_acceptance is a fraction"),
        (["--gate", "speedup >= 'a'"], "only figures, numbers, comparisons"),
        (["--category", "math"], "no goldens of category math"),
    ],
)
def test_bad_input_is_one_line_and_empty_stdout(goldens, args, message):
    result = run("--goldens", goldens, *args)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert message in result.stderr and result.stderr.count("\n") == 1


def test_missing_goldens_and_default_folder(tmp_path, monkeypatch):
    result = run("--goldens", tmp_path / "nope.jsonl")
    assert (result.exit_code, result.stdout) == (1, "")
    assert "nope.jsonl not found: pass --goldens with a golden JSONL file" in result.stderr
    monkeypatch.setattr(probe_config, "SHIPPED_GOLDENS", tmp_path)
    result = run()
    assert (result.exit_code, result.stdout) == (1, "")
    assert f"no golden files (*.jsonl) found in {tmp_path}" in result.stderr


def test_bad_golden_file_names_line(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text('{"id": 1}\n')
    result = run("--goldens", path)
    assert result.exit_code == 1 and result.stdout == ""
    assert f"{path}:1: missing field(s) category" in result.stderr


def test_markdown_written(goldens, tmp_path):
    out = tmp_path / "docs" / "report.md"
    result = run("--goldens", goldens, "--k", "1,3", "--window", "1-2", "--markdown", out, "--json")
    assert result.exit_code == 0, result.stderr
    json.loads(result.stdout)  # stdout is still exactly one JSON object
    text = out.read_text()
    assert "Regenerate with `kolibri probe --goldens" in text
    assert re.search(r"\| k=3 \| \*\*\d\.\d\dx \(1\.80x, 66\.7%\)\*\* ★ \|", text)
    speedup = r"\| \d\.\d\dx \| "
    totals = r"9 \| 5 \| 1\.80x \| 6 \| 4 \| 66\.7% \| 2\.33 \|"
    assert re.search(r"\| all " + speedup + totals, text)
    mix = r"7 \| 3 \| 2\.33x \| 5 \| 4 \| 80\.0% \| 3\.00 \|"
    assert re.search(r"\| mix \(code\) " + speedup + mix, text)
    assert "| 3 | 1 | 0 | 0.0% |" in text  # position 3: drafted once, never accepted


def test_probe_toml(goldens, tmp_path):
    toml = tmp_path / "probe.toml"
    toml.write_text('goldens = "g.jsonl"\nk = [1, 3]\nwindow = "1-2"\nmarkdown = "out/r.md"\n')
    result = run(toml, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [r["k"] for r in doc["runs"]] == [1, 3]
    assert "kolibri probe" in (tmp_path / "out" / "r.md").read_text()
    override = run(toml, "--k", "3", "--json")  # the command line wins over the file
    assert [r["k"] for r in json.loads(override.stdout)["runs"]] == [3]


def test_each_option_is_the_config_field_and_toml_key_of_its_name():
    """cli/probe.py declares the options, ProbeConfig the fields they set: the same names in the
    same order (--help's, PROBE.toml's keys'), and a switch is a bool field."""
    import dataclasses
    import inspect

    from kolibri_cli.cli.probe import probe
    from kolibri_cli.probe.config import FIELDS, ProbeConfig

    options = [name for name in inspect.signature(probe).parameters
               if name not in ("config", "ray_address")]  # --ray-address: --ray's address
    assert options == FIELDS
    types = {f.name: f.type for f in dataclasses.fields(ProbeConfig)}
    switches = [name for name, p in inspect.signature(probe).parameters.items()
                if "bool" in str(p.annotation)]
    assert [name for name in switches if name != "ray"] == [
        name for name in FIELDS if types[name] in (bool, "bool")]


def test_the_setting_grid_is_proposer_major_with_each_proposers_defaults():
    from kolibri_cli.probe.config import ProbeConfig

    cfg = ProbeConfig(proposer=["vllm", "llamacpp-simple"])
    assert cfg.settings() == [("vllm", 5, (1, 4)), ("llamacpp-simple", 48, (12, 12))]
    cfg = ProbeConfig(proposer=["vllm", "guard"], k=[2, 3], window=[(1, 2), (2, 4)])
    assert cfg.settings() == [(p, k, w) for p in ("vllm", "guard") for k in (2, 3)
                              for w in ((1, 2), (2, 4))]


def test_probe_toml_unknown_key(tmp_path):
    toml = tmp_path / "probe.toml"
    toml.write_text('goldens = "g.jsonl"\nkk = 5\nwindows = "1-4"\n')
    result = run(toml)
    assert (result.exit_code, result.stdout) == (1, "")
    assert "unknown key(s) kk, windows" in result.stderr


def test_probe_toml_bad_values(tmp_path):
    toml = tmp_path / "probe.toml"
    toml.write_text('k = "five"\n')
    assert "k must be a whole number" in run(toml).stderr
    toml.write_text("json = 1\n")
    assert "json must be true or false, got 1" in run(toml).stderr
    toml.write_text("k = [5\n")
    assert "not valid TOML" in run(toml).stderr
    assert "probe config not found" in run(tmp_path / "missing.toml").stderr


def test_plot_without_matplotlib(goldens, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    result = run("--goldens", goldens, "--plot", tmp_path / "p.png")
    assert (result.exit_code, result.stdout) == (1, "")
    assert "--plot needs matplotlib" in result.stderr
    assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize(("load", "panels"), [([], 2), (["--concurrency", "1,2,4"], 3)])
def test_plot_written(goldens, tmp_path, monkeypatch, load, panels):
    """The PNG holds the figure drawn: 5.5 x 4 inches per panel at 120 dpi; the sweep's line per
    window with the fastest setting starred, the acceptance per draft position, and with
    --concurrency the speedup under load."""
    pytest.importorskip("matplotlib")  # the plot extra, which .ci/run installs
    import matplotlib.image
    import matplotlib.pyplot as plt

    drawn = []
    monkeypatch.setattr(plt, "close", drawn.append)  # the figure, kept to be read
    out, md = tmp_path / "img" / "p.png", tmp_path / "docs" / "r.md"
    result = run("--goldens", goldens, "--k", "1,3", "--window", "1-2", "--costs", COSTS,
                 "--plot", out, "--markdown", md, "--json", *load)
    assert result.exit_code == 0, result.stderr
    png = out.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    size = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert size == (660 * panels, 480)
    pixels = matplotlib.image.imread(out)  # it decodes, and is not one flat colour
    assert pixels.shape[:2] == (480, 660 * panels) and pixels.std() > 0
    (fig,) = drawn
    sweep, positions, *rest = fig.axes
    assert len(fig.axes) == panels
    best = json.loads(result.stdout)["best"]
    (line, one, star) = sweep.get_lines()
    assert list(line.get_xdata()) == [1, 3] and list(one.get_ydata()) == [1.0, 1.0]
    assert (list(star.get_xdata()), list(star.get_ydata())) == ([best["k"]], [best["speedup"]])
    run_ = next(r for r in json.loads(result.stdout)["runs"] if r["best"])
    assert [bar.get_height() for bar in positions.patches] == \
        run_["total"]["accepted_per_position"]
    assert [ax.get_title() for ax in rest] == ["under load"] * (panels - 2)
    assert "![predicted speedup over k, and per-position acceptance](../img/p.png)" in \
        md.read_text()


def _result(goldens, runs, measured, **config):
    from kolibri_cli.costs.pricing import Pricing
    from kolibri_cli.probe.config import ProbeConfig
    from kolibri_cli.probe.result import build_result

    cfg = ProbeConfig(goldens=[goldens], **config)
    return build_result(cfg, runs, Pricing("given", {1: 1.0}), measured)


def test_measured_section_and_speedup_gate(goldens):
    from kolibri_cli.goldens.chains import load_goldens
    from kolibri_cli.probe.replay.shards import simulate
    from kolibri_cli.probe.report import build_report
    from kolibri_cli.probe.result import Measured, MeasuredGolden

    run_ = simulate(load_goldens(goldens), 3, (1, 2))
    one = MeasuredGolden("mix", 20.0, 30.0, 1.5, 1.65, True, None, True, 3, 5, 4)
    measured = {
        ("vllm", 3, (1, 2)): Measured(20.0, 26.0, 1.3, 1.43, {1: 1.0, 4: 1.2}, 1e-5, True, True,
                                      [one])
    }
    doc = build_report(_result(goldens, [run_], measured))
    m = doc["runs"][0]["measured"]
    assert m["costs"] == {"1": 1.0, "4": 1.2}
    assert m["prediction_error"] == pytest.approx(0.1)
    assert m["goldens"][0]["first_divergence"] is None and m["goldens"][0]["speedup"] == 1.5
    assert doc["best"]["speedup"] == 1.3 and doc["best"]["basis"] == "measured"
    assert _result(goldens, [run_], measured, min_speedup=1.2).failures == []
    assert _result(goldens, [run_], measured, min_speedup=1.5).failures == [
        "measured speedup 1.300 < min-speedup 1.5 (vllm k=3 window=1-2)"
    ]
    predicted = _result(goldens, [run_], {}, min_speedup=9.0)
    assert predicted.failures == [
        f"predicted speedup {run_.modelled_speedup():.3f} < min-speedup 9 (vllm k=3 window=1-2)"
    ]


def test_speedup_gate_reads_the_measured_run_of_a_sweep(goldens):
    """--measure measures the fastest setting: the gate reads its measured speedup, and that
    setting leads the ranking whatever the others predict."""
    from kolibri_cli.goldens.chains import load_goldens
    from kolibri_cli.probe.replay.shards import sweep
    from kolibri_cli.probe.result import Measured

    runs = sweep(load_goldens(goldens), [1, 3], [(1, 2)])
    measured = {("vllm", 3, (1, 2)): Measured(20.0, 26.0, 1.3, 1.43, {1: 1.0}, 0.0, True, True)}
    result = _result(goldens, runs, measured, min_speedup=1.2)
    assert result.best is runs[1] and result.failures == []
    assert _result(goldens, runs, measured, min_speedup=1.4).failures == [
        "measured speedup 1.300 < min-speedup 1.4 (vllm k=3 window=1-2)"
    ]


SMOKE_GATES = ["spec_equals_plain == 1 & counts_match_simulation == 1",
               "0.6 * expected <= measured <= 1.5 * expected"]


@pytest.mark.parametrize(("same", "counts", "speedup", "expected", "failed"), [
    (True, True, 0.8, 0.9, []),  # a loss, as predicted by this host's c(n): passes
    (False, True, 1.3, 1.3, [0]),  # spec != plain
    (True, False, 1.3, 1.3, [0]),  # the real counts != the simulation's
    (True, True, 0.5, 0.9, [1]),  # far slower than its c(n) predict
    (True, True, 1.5, 0.9, [1]),  # far faster: a plain path slowed, or c(n) mistimed
])
def test_smoke_gates_read_the_laws_and_this_hosts_prediction(goldens, same, counts, speedup,
                                                             expected, failed):
    """The gates probes/smoke.toml sets read what holds on any CPU: spec == plain, counts ==
    simulation, and the measured speedup against the one c(n) timed in the same run predict."""
    from kolibri_cli.goldens.chains import load_goldens
    from kolibri_cli.probe.replay.shards import simulate
    from kolibri_cli.probe.result import Measured

    run_ = simulate(load_goldens(goldens), 3, (1, 2))
    m = Measured(20.0, 16.0, speedup, expected, {1: 1.0}, 0.0, same, counts)
    result = _result(goldens, [run_], {("vllm", 3, (1, 2)): m}, gate=SMOKE_GATES)
    assert [line.split(" is false")[0] for line in result.failures] == [
        SMOKE_GATES[i] for i in failed]
    laws = f"spec_equals_plain {float(same):.3f}, counts_match_simulation {float(counts):.3f}"
    assert all(laws in line for line in result.failures if line.startswith(SMOKE_GATES[0]))


def test_smoke_gates_fail_without_a_measured_run(goldens):
    """Without --measure the laws and `expected` are n/a: the gates fail, they do not pass."""
    from kolibri_cli.goldens.chains import load_goldens
    from kolibri_cli.probe.replay.shards import simulate

    run_ = simulate(load_goldens(goldens), 3, (1, 2))
    assert _result(goldens, [run_], {}, gate=SMOKE_GATES).failures == [
        f"{SMOKE_GATES[0]} is false: spec_equals_plain n/a, counts_match_simulation n/a "
        "(vllm k=3 window=1-2)",
        f"{SMOKE_GATES[1]} is false: expected n/a, measured n/a (vllm k=3 window=1-2)"]


def test_the_smoke_probe_sets_those_gates_and_no_absolute_speedup():
    """CI's probe gates what the tests above prove can fail, and no speedup a CPU decides."""
    cfg = tomllib.loads((Path(__file__).parents[1] / "probes" / "smoke.toml").read_text())
    assert set(SMOKE_GATES) <= set(cfg["gate"]) and cfg["measure"] is True
    assert "min_speedup" not in cfg and not any("speedup" in g for g in cfg["gate"])


def test_measured_totals_with_one_token_goldens_predict_nothing():
    """--max-tokens 1 leaves no decode step: the measured totals have nothing to predict (it
    divided by zero)."""
    from tiny_models import MODELS

    from kolibri_cli.decode.generate import generate_plain
    from kolibri_cli.goldens.chains import Golden
    from kolibri_cli.probe.measure import measure_run
    from kolibri_cli.probe.replay.shards import simulate

    model = MODELS[0]
    prompt = [5, 6, 7, 5, 6]
    one = generate_plain(model, prompt, 1).output_ids
    golden = Golden("g", "c", "p", False, prompt, one, "m", "0" * 64)
    m = measure_run(model, [golden], simulate([golden], 3, (1, 2)))
    assert m.predicted_speedup is None and m.spec_equals_plain and m.counts_match_simulation


def test_guard_and_fixed_measured_in_one_run_agree_with_their_simulations():
    """The guard measures its own costs while it runs; its simulation replays the costs it read,
    so counts == simulation holds for it as for a fixed rule, round after round."""
    from tiny_models import MODELS

    from kolibri_cli.decode.generate import generate_plain
    from kolibri_cli.goldens.chains import Golden
    from kolibri_cli.probe.measure import measure_runs
    from kolibri_cli.probe.replay.shards import simulate

    model = MODELS[0]
    prompts = [[5, 6, 7] * 4, [9, 3, 9, 3, 4]]
    goldens = [Golden(f"g{i}", "c", "p", False, p, generate_plain(model, p, 30).output_ids, "m",
                      "0" * 64) for i, p in enumerate(prompts)]
    runs = [simulate(goldens, 8, (1, 4), "guard"), simulate(goldens, 3, (1, 4), "vllm")]
    measured = measure_runs(model, goldens, runs, repeats=2)
    assert list(measured) == [("guard", 8, (1, 4)), ("vllm", 3, (1, 4))]
    assert [m.guard_costs_from for m in measured.values()] == ["none", None]
    for m in measured.values():
        assert m.spec_equals_plain and m.counts_match_simulation
        assert [g.id for g in m.goldens] == ["g0", "g1"]
        assert m.worst.speedup == min(g.speedup for g in m.goldens)


def test_goldens_too_short_to_time_are_marked_and_left_out_of_overall_and_worst():
    """A chain of 1-3 decode steps lasts a few ms: its measured speedup is timing noise. It is
    marked (JSON, tables, Markdown) and the overall figures and the worst are the other
    goldens'."""
    from tiny_models import MODELS

    from kolibri_cli.cli.render.probe import guard_table, measured_table
    from kolibri_cli.decode.generate import generate_plain
    from kolibri_cli.goldens.chains import Golden
    from kolibri_cli.probe.measure import measure_runs
    from kolibri_cli.probe.replay.shards import simulate
    from kolibri_cli.probe.report import guard_json
    from kolibri_cli.probe.result import MIN_TIMED_STEPS

    model = MODELS[0]
    lengths = {"long": 30, "short": 2, "edge": MIN_TIMED_STEPS + 1}  # edge: exactly 4 steps
    goldens = [Golden(name, "c", "p", False, [5, 6, 7] * 4,
                      generate_plain(model, [5, 6, 7] * 4, n).output_ids, "m", "0" * 64)
               for name, n in lengths.items()]
    measured = measure_runs(model, goldens, [simulate(goldens, 3, (1, 4), "vllm")])
    [m] = measured.values()
    assert [g.too_short for g in m.goldens] == [False, True, False]
    assert m.left_out == 1 and m.worst.id != "short"
    timed = [g for g in m.goldens if not g.too_short]
    steps = sum(n - 1 for n in (30, MIN_TIMED_STEPS + 1))
    assert m.plain_tokens_per_s == pytest.approx(
        steps / sum((n - 1) / g.plain_tokens_per_s for n, g in zip((30, 5), timed, strict=True)))
    doc = m.to_json()
    assert doc["left_out"] == 1 and doc["goldens"][1]["too_short"] is True
    assert doc["worst"]["id"] != "short"
    guard = guard_json(measured)
    assert guard["goldens"]["short"] == [None] and guard["left_out"] == [1]
    assert "1 golden(s) too short to time" in measured_table(m, "x").caption
    assert any("too short" in str(c) for row in guard_table(measured).rows for c in row)


def test_guard_report_sets_configurations_side_by_side(goldens, tmp_path):
    from kolibri_cli.cli.render.probe import guard_table
    from kolibri_cli.goldens.chains import load_goldens
    from kolibri_cli.probe.replay.shards import simulate
    from kolibri_cli.probe.report import guard_json, render_markdown
    from kolibri_cli.probe.result import Measured, MeasuredGolden

    def golden(gid, x):
        return MeasuredGolden(gid, 20.0, 20.0 * x, x, None, True, None, True, 3, 4, 2)

    measured = {
        ("guard", 16, (1, 4)): Measured(20.0, 24.0, 1.2, None, {1: 1.0}, 0.0, True, True,
                                        [golden("a", 1.5), golden("b", 0.98)]),
        ("vllm", 5, (1, 4)): Measured(20.0, 22.0, 1.1, None, {1: 1.0}, 0.0, True, True,
                                      [golden("a", 1.7), golden("b", 0.9)]),
    }
    measured[("vllm", 5, (1, 4))].goldens[1].speedup_interval = (0.85, 0.96)
    doc = guard_json(measured)
    assert doc == {"configurations": ["guard k=16 window=1-4", "vllm k=5 window=1-4"],
                   "goldens": {"a": [1.5, 1.7], "b": [0.98, 0.9]}, "left_out": [0, 0],
                   "overall": [1.2, 1.1],
                   "worst": [{"id": "b", "speedup": 0.98, "interval": None},
                             {"id": "b", "speedup": 0.9, "interval": [0.85, 0.96]}]}
    assert measured[("vllm", 5, (1, 4))].to_json()["worst"] == {
        "id": "b", "speedup": 0.9, "interval": (0.85, 0.96)}
    run_ = simulate(load_goldens(goldens), 5, (1, 4))
    text = render_markdown(_result(goldens, [run_], measured), "kolibri probe")
    assert "## Guard: measured spec / plain per golden" in text
    assert "| worst | 0.98x | 0.90x |" in text
    assert "| worst, 95% interval | - | 0.85x - 0.96x |" in text
    assert guard_table(measured).cols[2].header == "vllm k=5 window=1-4"


def test_regenerate_command_reproduces_the_report(goldens, tmp_path):
    """The Markdown's 'Regenerate with' command, run as printed, writes the same report."""
    import shlex

    first, second = tmp_path / "a.md", tmp_path / "b.md"
    result = run("--goldens", goldens, "--k", "1,3", "--window", "1-2", "--by-category",
                 "--threads", "1", "--min-ratio", "1.1",
                 "--markdown", first)
    assert result.exit_code == 0, result.stderr
    line = next(x for x in first.read_text().splitlines() if x.startswith("Regenerate with"))
    command = shlex.split(line[line.index("`") + 1:line.rindex("`")])
    assert "--threads" in command
    assert "--by-category" in command and "--min-ratio" in command
    args = command[2:]
    args[args.index("--markdown") + 1] = str(second)
    assert run(*args).exit_code == 0
    assert second.read_text() == first.read_text().replace(str(first.name), str(second.name))


@pytest.mark.parametrize("width", [80, 60])
def test_tables_never_cut_a_number(tmp_path, width):
    """At 80 and 60 columns every number of every table is printed whole (no '…')."""
    path = tmp_path / "g.jsonl"
    lines = [{"id": f"a-long-golden-name-{i}", "category": "summarization-and-more",
              "prompt": "p", "chat": True, "prompt_ids": [1, 2, 3, 4, 5],
              "output_ids": [1, 2, 3, 9, 1, 2, 3, 4] * (40 * i + 1), "model": "m",
              "model_sha256": "0" * 64, "reference": {}} for i in range(3)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    args = ["--goldens", path, "--k", "1,3,10", "--window", "1-2,1-4", "--proposer",
            "vllm,llamacpp-simple,suffix", "--by-category"]
    result = CliRunner().invoke(app, ["probe", *map(str, args)], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.stderr
    assert "…" not in result.stdout
    doc = json.loads(run(*args, "--json").stdout)
    commands = [x for c in doc["verdict"]["commands"] for x in (c["command"], c["off_above"]) if x]
    # a command is printed whole, on one line, to paste; every other line fits
    assert max(len(line) for line in result.stdout.splitlines()
               if not any(c in line for c in commands)) <= width
    best = next(r for r in doc["runs"] if r["best"])
    for number in (best["total"]["plain_steps"], best["total"]["verify_passes"]):
        assert f" {number} " in result.stdout
