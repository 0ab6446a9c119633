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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kolibri_cli.costs.pricing import Pricing, parse_costs, read_costs_file
from kolibri_cli.decode.proposers import (
    DEFAULT_PROPOSER,
    LlamaCppOptions,
    canonical_proposer,
    default_settings,
    format_window,
    parse_k_list,
    parse_window_list,
)
from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.chains import SHIPPED_GOLDENS, Golden
from kolibri_cli.goldens.stream import find_golden_files, iter_goldens
from kolibri_cli.text import finite, read_text_file, shown


@dataclass
class ProbeConfig:
    """Everything one probe run needs; defaults are the command's defaults. Each field up to
    `bench_costs` is a PROBE.toml key and the `kolibri probe` option of the same name
    (cli/probe.py declares the option and its help; --min-hits sets `min_hits`)."""

    # what to simulate
    goldens: list[Path] = field(default_factory=list)  # files or folders; [] = the shipped ones
    k: list[int] = field(default_factory=list)  # draft tokens per pass; [] = each proposer's own
    window: list[tuple[int, int]] = field(default_factory=list)  # (min, max) n; [] = its own
    proposer: list[str] = field(default_factory=lambda: [DEFAULT_PROPOSER])  # canonical names
    cross_request: bool = False  # suffix: also draft from earlier goldens' outputs
    # llama.cpp's per-type options (LlamaCppOptions); None = upstream's default
    min_hits: int | None = None
    n_min: int | None = None
    lookup_cache_static: Path | None = None
    lookup_cache_dynamic: Path | None = None
    category: list[str] | None = None  # only goldens of these categories
    where: str | None = None  # only goldens whose columns meet this (where.py), as given
    limit: int | None = None  # at most this many goldens
    max_tokens: int | None = None  # each golden's first N output ids
    concurrency: list[int] | None = None  # B values to simulate under load (probe/load.py)
    # pricing: c(1), c(2), ... as given; None = a stored bench, the guess (bench_costs False) or
    # timed now (measure_costs)
    costs: dict[int, float] | None = None
    # reports and gates
    by_category: bool = False
    json: bool = False
    markdown: Path | None = None
    plot: Path | None = None
    rows: Path | None = None  # every chain's counts as JSONL
    gate: list[str] | None = None  # numexpr expressions over the figures (gates.py)
    min_speedup: float | None = None  # the gate shorthands
    min_ratio: float | None = None
    min_acceptance: float | None = None
    # measuring with the model
    measure: bool = False
    bench: bool = False  # add the bench chain
    model: str | None = None
    threads: int | None = None
    repeats: int | None = None  # None: measure_repeats()
    engine: str | None = None  # None or "kolibri", "llama-server", or a server's URL
    baseline: str | None = None  # the plain twin's URL
    engine_api: str | None = None
    gguf: Path | None = None
    timeout: float = 600.0  # seconds for one server answer
    allow_model_mismatch: bool = False
    temperature: float | None = None  # sampling overrides (SAMPLING_KEYS); None = the golden's
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    # scale
    workers: int | None = None  # local processes; None = the cores (1 for a small input)
    ray: str | None = None  # "local" (--ray) or a cluster's address (--ray-address)
    # not options: how the run was asked for, and what it chose
    bench_costs: bool = True  # without costs: kolibri bench's stored c(n) (False: costs="default")
    measure_costs: bool = False  # costs="measure": time c(n) on this host now, and keep it
    source: Path | None = None  # the PROBE.toml this came from, if any
    pricing: Pricing | None = None  # the c(n) the run prices with, chosen by the command

    def settings(self) -> list[tuple[str, int, tuple[int, int]]]:
        """Every (proposer, k, window) the run simulates, proposer-major then k then window
        (the order of every report); no k or no window given = each proposer's own."""
        return [(p, k, w) for p in self.proposer
                for k in (self.k or [default_settings(p)[0]])
                for w in (self.window or [default_settings(p)[1]])]

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
            "where": self.where,
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


CHOSEN = ("bench_costs", "measure_costs", "source", "pricing")  # set by the run, not asked
FIELDS = [f.name for f in dataclasses.fields(ProbeConfig) if f.name not in CHOSEN]  # the keys
REPEATED = ("goldens", "gate")  # options given once per value (--gate A --gate B)
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
    if key == "where":
        from kolibri_cli.probe.where import parse_where

        return parse_where(_expect(value, key, str)).text  # a bad expression fails now
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
    for g in _selected(iter_goldens(files), config.category, config.where):
        if len(goldens) == config.limit:
            break
        if most is not None and len(goldens) == most:
            raise KolibriError(f"more than {most} goldens: too many to hold in memory for this; "
                               "pick some with --limit or --category")
        goldens.append(g)
    if not goldens and (config.category or config.where):
        raise KolibriError(nothing_selected(config))
    if config.max_tokens:
        goldens = [
            dataclasses.replace(g, output_ids=g.output_ids[: config.max_tokens]) for g in goldens
        ]
    return goldens


def nothing_selected(config: ProbeConfig) -> str:
    """The error when --category or --where left no golden."""
    of = f" of category {', '.join(config.category)}" if config.category else ""
    return f"no goldens{of}" + (f" where {config.where}" if config.where else "")


def _selected(goldens: Iterable[Golden], category: list[str] | None,
              where: str | None) -> Iterator[Golden]:
    """The goldens of those categories that meet `where` (numexpr over batches), in order."""
    from kolibri_cli.probe.where import parse_where

    kept = (g for g in goldens if not category or g.category in category)
    return parse_where(where).select(kept) if where else kept


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


NOT_IN_COMMAND = ("json", "rows", "workers", "ray")  # change how, not what


def command_line(cfg: "ProbeConfig") -> str:
    """The command that regenerates this report (for the Markdown header): every option given
    that changes what it says: field `max_tokens` is option --max-tokens."""
    if cfg.source:
        return f"kolibri probe {_rel(cfg.source)}"
    args = ["kolibri", "probe"]
    defaults = ProbeConfig(goldens=cfg.goldens)
    for name in FIELDS:
        value, flag = getattr(cfg, name), "--" + name.replace("_", "-")
        if name in NOT_IN_COMMAND or value in (None, "", [], False) or (
                name != "goldens" and value == getattr(defaults, name)):
            continue
        if value is True:  # a switch
            args.append(flag)
        elif name in REPEATED:
            for item in value:
                args += [flag, _as_given(item)]
        else:
            args += [flag, _as_given(value)]
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
