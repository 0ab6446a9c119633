"""PROBE.toml: a saved `kolibri probe` invocation. Keys mirror the command-line options.

Scope: reading and validating the file (unknown keys are errors that name them), resolving its
paths relative to the file, merging it with the command line (the command line wins), and
selecting the goldens the config asks for. Keys: docs/probe.md.
"""

import dataclasses
import math
import os
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

from kolibri_cli.costs.pricing import Pricing, parse_costs, read_costs_file
from kolibri_cli.decode.proposers import (
    DEFAULT_K,
    DEFAULT_PROPOSER,
    DEFAULT_WINDOW,
    GUARD_K,
    PROPOSERS,
    LlamaCppOptions,
    canonical_proposer,
    format_window,
    parse_k_list,
    parse_window_list,
)
from kolibri_cli.decode.sampling import OPTION_HELP as SAMPLING_HELP
from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.chains import SHIPPED_GOLDENS, Golden
from kolibri_cli.goldens.stream import find_golden_files, iter_goldens
from kolibri_cli.probe.options import MEASURE, PRICE, REPORT, SCALE, SIMULATE, guess_text, opt
from kolibri_cli.text import finite, read_text_file, shown


@dataclass
class ProbeConfig:
    """Everything one probe run needs; defaults are the command's defaults. Each option is
    declared here once (`opt`: flags, --help panel, help); PROBE.toml keys are the field
    names."""

    goldens: list[Path] = opt(
        ("--goldens", "-g"), "list", SIMULATE, metavar="PATH", default_factory=list,
        help="Golden JSONL file or folder (repeatable). [default: the shipped goldens]")
    k: list[int] = opt(
        "--k", "text", SIMULATE, metavar="K[,K...]", default_factory=list,
        help="Draft tokens per pass (tree proposers: tree nodes), or a sweep: 1,2,3,5,8. "
        f"[default: {DEFAULT_K}; guard: {GUARD_K}; llama.cpp's types and tree proposers: their "
        "own]")
    window: list[tuple[int, int]] = opt(
        "--window", "text", SIMULATE, metavar="MIN-MAX[,...]", default_factory=list,
        help="n-gram lengths MIN-MAX or N (llama.cpp's types: n = MAX), or a sweep: 1-4,2-4,3-5. "
        f"[default: {format_window(DEFAULT_WINDOW)}, or the proposer's own]")
    proposer: list[str] = opt(
        "--proposer", "text", SIMULATE, metavar="NAME[,...]",
        default_factory=lambda: [DEFAULT_PROPOSER],
        help=f"Draft proposer(s): {', '.join(PROPOSERS)} (ngram = vllm); several = a comparison "
        f"table. [default: {DEFAULT_PROPOSER}: a fixed rule vLLM, SGLang and llama.cpp run "
        "too, so the answer is a setting to deploy; `generate --spec` drafts with guard, "
        "kolibri's cost-aware rule (docs/probe.md)]")
    cross_request: bool = opt(
        "--cross-request/--no-cross-request", "switch", SIMULATE, default=False,
        help="suffix: also draft from a global tree over earlier goldens' outputs.")
    min_hits: int | None = opt(
        "--min-hits", "int", SIMULATE, metavar="N",
        help="llamacpp-map-k4v: key hits before it drafts. [default: 1]")
    n_min: int | None = opt(
        "--n-min", "int", SIMULATE, metavar="N",
        help="llamacpp-mod: fewest chained tokens that make a draft. [default: 48]")
    lookup_cache_static: Path | None = opt(
        "--lookup-cache-static", "path", SIMULATE, metavar="FILE",
        help="llamacpp-cache: a llama.cpp static n-gram cache file (llama-lookup-create).")
    lookup_cache_dynamic: Path | None = opt(
        "--lookup-cache-dynamic", "path", SIMULATE, metavar="FILE",
        help="llamacpp-cache: a llama.cpp dynamic n-gram cache file.")
    category: list[str] | None = opt(
        "--category", "text", SIMULATE, metavar="NAME[,...]",
        help="Only goldens of these categories (comma-separated).")
    limit: int | None = opt(
        "--limit", "int", SIMULATE, metavar="N",
        help="At most N goldens.")
    max_tokens: int | None = opt(
        "--max-tokens", "int", SIMULATE, metavar="N",
        help="Use only the first N output ids of each golden.")
    concurrency: list[int] | None = opt(
        "--concurrency", "text", SIMULATE, metavar="B[,B...]",
        help="Also simulate a server under steady load, B sequences at once (e.g. "
        "1,2,4,8,16,32,64): throughput speedup per B, the best setting per B, and the "
        "concurrency above which drafting stops paying (docs/load.md).")
    costs: dict[int, float] | None = opt(
        "--costs", "text", PRICE, metavar="C1,C2,...|measure|default",
        help="Forward costs c(1),c(2),... every predicted speedup is priced with (and adaptive, "
        "adaptive-tree and the guard draft by); measure = time them now on the goldens' model "
        "(tens of seconds) and keep them, as `kolibri bench` does; default = the guess below, "
        "ignoring stored benches. [default: the c(n) `kolibri bench` stored for the goldens' "
        f"model (and --threads), else a guess: {guess_text()}]")
    by_category: bool = opt(
        "--by-category/--no-by-category", "switch", REPORT, default=False,
        help="Also show the verdict and counts per category.")
    json: bool = opt(
        "--json/--no-json", "switch", REPORT, default=False,
        help="Print one JSON object on stdout instead of tables.")
    markdown: Path | None = opt(
        "--markdown", "path", REPORT, metavar="FILE",
        help="Write a Markdown report to FILE.")
    plot: Path | None = opt(
        "--plot", "path", REPORT, metavar="FILE.png",
        help="Write a PNG (predicted speedup over k with the 1.0x line, per-position "
        "acceptance); needs matplotlib.")
    rows: Path | None = opt(
        "--rows", "path", REPORT, metavar="FILE",
        help="Write every chain's counts to FILE (JSONL, one line per chain and "
        "configuration).")
    gate: list[str] | None = opt(
        "--gate", "list", REPORT, metavar="EXPR",
        help="Gate (repeatable): exit 1 unless EXPR holds for the fastest setting, e.g. "
        "'speedup >= 1.15 & worst >= 0.97'. Names: speedup, predicted, measured, low, "
        "high (its 95% interval), worst, faster (share of goldens), ratio, acceptance, "
        "mean_len, goldens, crossover; with --measure expected (this host's c(n) predict), "
        "spec_equals_plain, counts_match_simulation (1 or 0) (docs/probe.md).")
    min_speedup: float | None = opt(
        "--min-speedup", "float", REPORT, metavar="Z",
        help="Gate: exit 1 if the fastest setting's speedup (measured with --measure, else "
        "predicted) is below this; = --gate 'speedup >= Z'.")
    min_ratio: float | None = opt(
        "--min-ratio", "float", REPORT, metavar="X",
        help="Gate: exit 1 if the fastest setting's ratio is below this.")
    min_acceptance: float | None = opt(
        "--min-acceptance", "float", REPORT, metavar="Y",
        help="Gate: exit 1 if the fastest setting's acceptance rate is below this (0-1).")
    measure: bool = opt(
        "--measure/--no-measure", "switch", MEASURE, default=False,
        help="Also run the model, plain and spec, on every golden (for the fastest setting, of"
        " each proposer when comparing): tok/s, measured vs predicted speedup, spec == "
        "plain, and the guard report (spec / plain per golden, the worst).")
    bench: bool = opt(
        "--bench/--no-bench", "switch", MEASURE, default=False,
        help="Add the bench chain (a seeded random prompt whose greedy continuation cycles; "
        "runs the model once for its chain).")
    model: str | None = opt(
        ("--model", "-m"), "text", MEASURE, metavar="NAME|PATH",
        help="Model for --measure, --bench or --costs measure. For a server engine only its "
        "tokenizer is read (a folder of tokenizer files, or a GGUF's metadata). [default: with "
        "--engine URL the server's own tokenizer, else smollm2-135m-instruct]")
    threads: int | None = opt(
        ("--threads", "-t"), "int", MEASURE, metavar="N",
        help="Kernel (or started llama-servers') threads for --measure and --costs measure.")
    repeats: int | None = opt(
        "--repeats", "int", MEASURE, metavar="N",
        help="--measure: runs per golden, plain and spec taking turns; medians. In kolibri: "
        "rounds over every golden, each running every measured configuration; N for the "
        "longest golden, more for shorter ones (up to 4N) [default: 1 in kolibri, 3 on a "
        "server]")
    engine: str | None = opt(
        "--engine", "text", MEASURE, metavar="ENGINE",
        help="Where --measure runs: kolibri; llama-server (started on the model's GGUF, with "
        "c(n) timed in its own loop); or the base URL of a speculating server (with "
        "--baseline). [default: kolibri]")
    baseline: str | None = opt(
        "--baseline", "text", MEASURE, metavar="URL",
        help="Base URL of the plain twin of the server at --engine URL (same model, no "
        "speculation).")
    engine_api: str | None = opt(
        "--engine-api", "text", MEASURE, metavar="API",
        help="API of the servers at URLs: llama.cpp, vllm or openai. [default: detected]")
    gguf: Path | None = opt(
        "--gguf", "path", MEASURE, metavar="FILE",
        help="GGUF for --engine llama-server. [default: the model's own]")
    timeout: float = opt(
        "--timeout", "float", MEASURE, metavar="S", default=600.0,
        help="Seconds to wait for one server answer. [default: 600]")
    allow_model_mismatch: bool = opt(
        "--allow-model-mismatch/--no-allow-model-mismatch", "switch", MEASURE, default=False,
        help="Measure goldens recorded for another model.")
    temperature: float | None = opt(
        "--temperature", "float", MEASURE,
        help=SAMPLING_HELP["temperature"])
    top_k: int | None = opt(
        "--top-k", "int", MEASURE,
        help=SAMPLING_HELP["top_k"])
    top_p: float | None = opt(
        "--top-p", "float", MEASURE,
        help=SAMPLING_HELP["top_p"])
    min_p: float | None = opt(
        "--min-p", "float", MEASURE,
        help=SAMPLING_HELP["min_p"])
    repetition_penalty: float | None = opt(
        "--repetition-penalty", "float", MEASURE,
        help=SAMPLING_HELP["repetition_penalty"])
    seed: int | None = opt(
        "--seed", "int", MEASURE,
        help=SAMPLING_HELP["seed"])
    workers: int | None = opt(
        ("--workers", "-w"), "int", SCALE, metavar="N",
        help="Simulate in N local processes. [default: the cores; 1 for a small input]")
    ray: str | None = opt(
        "--ray/--no-ray", "switch", SCALE,
        help="Simulate on Ray: a new local Ray instance, or the cluster at --ray-address; "
        "needs kolibri-cli[ray].")
    ray_address: str | None = opt(
        "--ray-address", "text", SCALE, metavar="ADDRESS", toml=False,
        help="The Ray cluster for --ray (implies it): auto = the one this machine is in, "
        "ray://HOST:10001, HOST:6379.")
    # not options: how the run was asked for, and what it chose
    bench_costs: bool = True  # without costs: kolibri bench's stored c(n) (False: costs="default")
    measure_costs: bool = False  # costs="measure": time c(n) on this host now, and keep it
    source: Path | None = None  # the PROBE.toml this came from, if any
    pricing: Pricing | None = None  # the c(n) the run prices with, chosen by the command

    def priced_costs(self) -> dict[int, float] | None:
        """The c(n) the simulation uses: as chosen (`pricing`), else as given."""
        return self.costs if self.pricing is None else self.pricing.costs

    def to_json(self) -> dict:
        """The `config` section of the JSON report."""
        return {
            "source": _str_or_none(self.source),
            "goldens": [str(p) for p in self.goldens],
            "proposer": self.proposer[0],
            "proposers": self.proposer,
            "cross_request": self.cross_request,
            "llamacpp": {"min_hits": self.min_hits, "n_min": self.n_min,
                         "lookup_cache_static": _str_or_none(self.lookup_cache_static),
                         "lookup_cache_dynamic": _str_or_none(self.lookup_cache_dynamic)},
            "costs": ("default" if not self.bench_costs else None) if self.costs is None
            else {str(n): c for n, c in self.costs.items()},
            "k": self.k or None,  # None: each proposer's default
            "window": [format_window(w) for w in self.window] or None,
            "category": self.category,
            "limit": self.limit,
            "max_tokens": self.max_tokens,
            "measure": self.measure,
            "engine": self.engine,
            "baseline": self.baseline,
            "repeats": self.measure_repeats(),
            "model": self.model,
            "min_ratio": self.min_ratio,
            "min_acceptance": self.min_acceptance,
            "min_speedup": self.min_speedup,
            "gate": self.gate,
            "concurrency": self.concurrency,
            "sampling": self.sampling_overrides(),
            "rows": _str_or_none(self.rows),
        }

    def measure_repeats(self) -> int:
        """Runs per golden for --measure: as given, else 1 in kolibri and 3 on a server."""
        if self.repeats is not None:
            return self.repeats
        return 1 if self.engine in (None, "kolibri") else 3

    def sampling_overrides(self) -> dict:
        """The sampling settings given for --measure (empty: each golden's own)."""
        return {key: getattr(self, key) for key in SAMPLING_KEYS if getattr(self, key) is not None}

    def llamacpp_options(self) -> LlamaCppOptions:
        return LlamaCppOptions(self.min_hits, self.n_min, self.lookup_cache_static,
                               self.lookup_cache_dynamic)


OPTIONS = {f.name: f.metadata["option"] for f in dataclasses.fields(ProbeConfig)
           if "option" in f.metadata}  # name -> Option, in --help's order
FIELDS = [name for name, option in OPTIONS.items() if option.toml]  # PROBE.toml's keys
PATH_KEYS = ("markdown", "plot", "gguf", "rows", "lookup_cache_static", "lookup_cache_dynamic")
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed")


def load_config(toml_path: Path | None, overrides: dict) -> ProbeConfig:
    """The PROBE.toml at `toml_path` (if any) with `overrides` (command-line values; None = not
    given) on top, validated."""
    raw = read_probe_toml(toml_path) if toml_path else {}
    raw.update({key: value for key, value in overrides.items() if value is not None})
    if raw.get("ray_address"):  # --ray-address ADDRESS is --ray on that cluster
        raw["ray"] = raw.pop("ray_address")
    raw.pop("ray_address", None)
    named = raw.get("costs") if isinstance(raw.get("costs"), str) else None
    word = named.strip() if named else None
    if word in ("default", "measure"):  # the guess / time this host now, not a stored bench
        del raw["costs"]
    config = ProbeConfig(
        source=toml_path, bench_costs=word != "default", measure_costs=word == "measure",
        **{key: _parse(key, value) for key, value in raw.items()}
    )
    if not config.goldens:
        config.goldens = [SHIPPED_GOLDENS]
    return config


def read_probe_toml(path: Path) -> dict:
    """The file's keys, with paths made relative to the file's folder."""
    text = read_text_file(path, "probe config")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise KolibriError(f"{path}: not valid TOML: {e}") from None
    except RecursionError:
        raise KolibriError(f"{path}: not valid TOML: nested too deeply") from None
    except ValueError:  # an integer of 4,300+ digits (Python's int conversion limit)
        raise KolibriError(f"{path}: not valid TOML: an integer of 4,300+ digits") from None
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise KolibriError(
            f"{path}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(FIELDS)}"
        )
    return _relative_to(raw, path.parent)


def _relative_to(raw: dict, folder: Path) -> dict:
    raw = dict(raw)
    if "goldens" in raw:
        raw["goldens"] = [str(folder / p) if p else "" for p in
                          _as_list(raw["goldens"], "goldens", str)]
    for key in PATH_KEYS:
        if key in raw:
            raw[key] = str(folder / _expect(raw[key], key, str))
    return raw


# Keys whose empty list would silently mean their default (or crash): refused by name.
NOT_EMPTY = ("goldens", "k", "window", "proposer", "costs", "concurrency", "category")


def _parse(key: str, value):
    """One config value from TOML or the command line -> its ProbeConfig type."""
    if key in NOT_EMPTY and isinstance(value, list) and not value:
        raise KolibriError(f"{key} = [] names nothing; leave {key} out for its default")
    if key == "goldens":
        paths = _as_list(value, key, str | Path)
        if any(str(p) == "" for p in paths):  # Path("") is ".": every *.jsonl under here
            raise KolibriError("goldens: an empty path; name a goldens file or folder")
        return [Path(p) for p in paths]
    if key == "k":
        return parse_k_list(value)
    if key == "window":
        return parse_window_list(value)
    if key == "proposer":
        items = value.split(",") if isinstance(value, str) else _as_list(value, key, str)
        return list(dict.fromkeys(canonical_proposer(p.strip()) for p in items))
    if key == "costs":
        return _costs(value)
    if key == "gate":
        from kolibri_cli.probe.gates import parse_gate

        gates = [value] if isinstance(value, str) else _as_list(value, key, str)
        for text in gates:
            parse_gate(text)  # a bad expression fails before anything runs
        return list(gates)
    if key == "concurrency":
        return _concurrency(value)
    if key == "category":
        items = value.split(",") if isinstance(value, str) else _as_list(value, key, str)
        categories = [c.strip() for c in items if c.strip()]
        if not categories:  # an empty filter chose every golden
            raise KolibriError(f"category {shown(value)} names no category; leave it out for "
                               "all goldens")
        return categories
    if key in ("model", "engine", "baseline", "engine_api"):
        return str(_expect(value, key, str | Path))
    if key == "timeout":
        return _timeout(value)
    if key == "ray":  # true: a local instance; a string: the cluster's address
        if isinstance(value, bool):
            return "local" if value else None
        return str(_expect(value, key, str))
    if key in ("limit", "max_tokens", "threads", "repeats", "workers", "min_hits"):
        return _positive_int(value, key)
    if key == "n_min":
        return _positive_int(value, key, low=0)
    if key in ("top_k", "seed"):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise KolibriError(f"{key} must be a whole number >= 0, got {shown(value)}")
        return value
    if key in SAMPLING_KEYS:
        if (number := finite(value)) is None:
            raise KolibriError(f"{key} must be a finite number, got {shown(value)}")
        return number
    if key in ("min_ratio", "min_acceptance", "min_speedup"):
        return _threshold(value, key)
    if key in PATH_KEYS:
        return Path(_expect(value, key, str | Path))
    return _expect(value, key, bool)


def select_goldens(config: ProbeConfig, most: int | None = None) -> list[Golden]:
    """The goldens the config names, filtered by category, limited, truncated to max_tokens, in
    memory; more than `most` of them is a KolibriError (`--limit` picks fewer)."""
    files = find_golden_files(config.goldens)
    if not files:
        where = ", ".join(str(p) for p in config.goldens)
        raise KolibriError(f"no golden files (*.jsonl) found in {where}; pass --goldens FILE")
    goldens = []
    for g in iter_goldens(files):
        if config.category and g.category not in config.category:
            continue
        if len(goldens) == config.limit:
            break
        if most is not None and len(goldens) == most:
            raise KolibriError(f"more than {most} goldens: too many to hold in memory for this; "
                               "pick some with --limit or --category")
        goldens.append(g)
    if not goldens and config.category:
        raise KolibriError(f"no goldens of category {', '.join(config.category)}")
    if config.max_tokens:
        goldens = [
            dataclasses.replace(g, output_ids=g.output_ids[: config.max_tokens]) for g in goldens
        ]
    return goldens


def _costs(value) -> dict[int, float]:
    """"1,1.05,1.1" or [1, 1.05, 1.1] -> {1: 1.0, 2: 1.05, 3: 1.1}: c(n) for n = 1, 2, ...; or
    the path of a c(n) curve file (costs.pricing.read_costs_file). A list of numbers is never
    taken for a file name (60 of them passed the longest name the system allows)."""
    if isinstance(value, str | Path) and not _number_list(str(value)) and _is_file(Path(value)):
        return read_costs_file(Path(value))
    items = value.split(",") if isinstance(value, str) else _as_list(value, "costs", int | float)
    return parse_costs(items, shown(value))


def _number_list(text: str) -> bool:
    return all(re.fullmatch(r"\s*[-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?\s*", p) for p in text.split(","))


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name too long, a loop of links: not a file to read
        return False


def _concurrency(value) -> list[int]:
    """"1,2,4" or [1, 2, 4] -> [1, 2, 4]: each a whole number in 1..MAX_CONCURRENCY."""
    from kolibri_cli.probe.load import MAX_CONCURRENCY

    items = value.split(",") if isinstance(value, str) else _as_list(value, "concurrency", int)
    numbers = [_positive_int(v.strip() if isinstance(v, str) else v, "concurrency")
               for v in items]
    if max(numbers) > MAX_CONCURRENCY:
        raise KolibriError(f"concurrency must be at most {MAX_CONCURRENCY}, got {max(numbers)}")
    return sorted(set(numbers))


def _positive_int(value, key: str, low: int = 1) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        number = low - 1
    if isinstance(value, bool) or isinstance(value, float) or number < low:
        raise KolibriError(f"{key} must be a whole number >= {low}, got {shown(value)}")
    return number


def _positive_number(value, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise KolibriError(f"{key} must be a number > 0, got {shown(value)}")
    try:
        return float(value)
    except OverflowError:  # an integer past float's range: as large as inf (callers cap it)
        return math.inf


def _timeout(value) -> float:
    """Checked before the run: inf or 1e300 overflows a socket's timeout, and only then."""
    from kolibri_cli.engines.transport import MAX_TIMEOUT

    timeout = _positive_number(value, "timeout")
    if not timeout <= MAX_TIMEOUT:
        raise KolibriError(f"timeout must be a number of seconds in (0, {MAX_TIMEOUT:g}], got "
                           f"{shown(value)}")
    return timeout


def _threshold(value, key: str) -> float:
    """A gate's threshold: a finite number >= 0 (a NaN would pass every gate)."""
    if (number := finite(value)) is None or number < 0:
        raise KolibriError(f"{key} must be a finite number >= 0, got {shown(value)}")
    if key == "min_acceptance" and number > 1:
        raise KolibriError(f"min_acceptance is a fraction between 0 and 1, got {value!r}")
    return number


def _expect(value, key: str, kind):
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        what = "true or false" if kind is bool else "a string"
        raise KolibriError(f"{key} must be {what}, got {shown(value)}")
    return value


def _as_list(value, key: str, kind) -> list:
    items = value if isinstance(value, list) else [value]
    return [_expect(item, key, kind) for item in items]


def _str_or_none(path: Path | None) -> str | None:
    return None if path is None else str(path)


NOT_IN_COMMAND = ("json", "rows", "workers", "ray", "ray_address")  # change how, not what


def command_line(cfg: "ProbeConfig") -> str:
    """The command that regenerates this report (for the Markdown header): every option given
    that changes what it says, from the one declaration of each (ProbeConfig)."""
    if cfg.source:
        return f"kolibri probe {_rel(cfg.source)}"
    args = ["kolibri", "probe"]
    defaults = ProbeConfig(goldens=cfg.goldens)
    for name, option in OPTIONS.items():
        value = getattr(cfg, name)
        if name in NOT_IN_COMMAND or value in (None, "", [], False) or (
                name != "goldens" and value == getattr(defaults, name)):
            continue
        if option.kind == "switch":
            args.append(option.flag)
        elif option.kind == "list":
            for item in value:
                args += [option.flag, _as_given(item)]
        else:
            args += [option.flag, _as_given(value)]
    if cfg.costs is None and (cfg.measure_costs or not cfg.bench_costs):
        args += ["--costs", "measure" if cfg.measure_costs else "default"]
    return shlex.join(args)


def _as_given(value) -> str:
    """An option's value as the command line takes it."""
    if isinstance(value, Path):
        return _rel(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):  # c(n)
        return ",".join(f"{c:g}" for c in value.values())
    if isinstance(value, tuple):  # a window
        return format_window(value)
    if isinstance(value, list):
        return ",".join(_as_given(v) for v in value)
    return str(value)


def _rel(path: Path) -> str:
    try:
        return str(Path(os.path.realpath(path)).relative_to(Path.cwd()))
    except ValueError:
        return str(path)
