"""Measure the probe at scale — the figures in docs/scale.md.

    python probes/scale.py traces N OUT.jsonl   the shipped chat goldens replicated to N chains
    python probes/scale.py replay              compiled vs reference replay, steps/s per core
    python probes/scale.py throughput N        `kolibri probe` over N chains: 1 process,
        [--proposer P] [--repeats R]           2 processes, local Ray (--json throughput)
    python probes/scale.py parts [N]           where a worker's CPU time goes: reading, parsing
                                               and checking goldens, tables, replay (N chains)
    python probes/scale.py memory              peak RSS of `kolibri probe` at 2k and 200k chains
    python probes/scale.py where [N] [EXPR]    `kolibri probe --workers 2` over N chains without
                                               and with --where EXPR: chains, time, peak RSS

Run from the repo root with kolibri installed (`throughput` needs kolibri-cli[ray] for its Ray row).
Speed figures are per CPU-second of the replaying process (time.process_time), so other work on
a shared machine inflates them less than wall time; each is the median of interleaved repeats.
Traces are written to build/ (never committed).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"


def write_traces(n: int, out: Path) -> Path:
    """The shipped chat goldens, replicated to n chains with unique ids (written atomically)."""
    from kolibri_cli.goldens.chains import DEFAULT_CHAT
    from kolibri_cli.store.atomic import atomic_path

    objs = [json.loads(line) for line in DEFAULT_CHAT.read_text().splitlines() if line.strip()]
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp, open(tmp, "w") as f:
        for i in range(n):
            obj = dict(objs[i % len(objs)])
            obj["id"] = f"{obj['id']}-{i // len(objs)}"
            f.write(json.dumps(obj) + "\n")
    return out


def traces(n: int) -> Path:
    path = BUILD / f"traces-{n}.jsonl"
    return path if path.exists() else write_traces(n, path)


def replay_speed(copies: int = 100, repeats: int = 5) -> None:
    """Steps/s per core of the compiled and the reference replay, on the shipped goldens
    replicated `copies` times (in memory: no parsing)."""
    from kolibri_cli.goldens.chains import DEFAULT_CHAT, load_goldens
    from kolibri_cli.probe.replay import Chains, Replayer, SimConfig

    goldens = load_goldens(DEFAULT_CHAT) * copies
    chains = Chains(goldens)
    warm = Chains(goldens[:18])
    print(f"load average {os.getloadavg()[0]:.1f}; {len(goldens)} chains, "
          f"{chains.plain_steps:,} decode steps; k=5 window=1-4", file=sys.stderr)
    cases = [("vllm", False), ("suffix", False), ("suffix", True), ("hf", False),
             ("llamacpp-simple", False)]
    for name, cross in cases:
        config = SimConfig(name, 5, (1, 4), cross_request=cross)
        rates = {True: [], False: []}
        for _ in range(repeats):
            for fast in (True, False):
                replayer = Replayer(config, fast_path=fast)
                replayer.replay(warm)  # compile or load the kernels outside the timing
                replayer = Replayer(config, fast_path=fast)
                t0 = time.process_time()
                replayer.replay(chains if fast else Chains(goldens[: len(goldens) // 10]))
                steps = chains.plain_steps if fast else chains.plain_steps // 10
                rates[fast].append(steps / (time.process_time() - t0))
        label = name + (" --cross-request" if cross else "")
        fast, ref = statistics.median(rates[True]), statistics.median(rates[False])
        print(f"{label:26s} compiled {fast / 1e6:6.2f}M steps/s per core   reference "
              f"{ref / 1e6:6.3f}M   x{fast / ref:.0f}")


def parts(n: int = 7_000, repeats: int = 5) -> None:
    """CPU seconds of each stage of a task over n chains (one piece of the replicated traces),
    vllm k=5 window=1-4: the share of reading and checking the JSON against the replay."""
    import gc

    from kolibri_cli.goldens.stream import Piece, read_piece
    from kolibri_cli.probe.replay import Chains, Replayer, SimConfig
    from kolibri_cli.probe.replay.shards import BATCH

    piece = Piece(str(traces(n)))
    gc.disable()  # as in a task (shards.run_task)
    times = {"read+parse+check": [], "tables": [], "replay": []}
    for _ in range(repeats):
        t0 = time.process_time()
        goldens = list(read_piece(piece))
        t1 = time.process_time()
        tables = [Chains(goldens[i : i + BATCH]) for i in range(0, len(goldens), BATCH)]
        t2 = time.process_time()
        replayer = Replayer(SimConfig("vllm", 5, (1, 4)))
        for table in tables:
            replayer.replay(table)
        t3 = time.process_time()
        for name, seconds in zip(times, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            times[name].append(seconds)
        del goldens, tables
    steps = sum(max(len(g.output_ids) - 1, 0) for g in read_piece(piece))
    medians = {name: statistics.median(values) for name, values in times.items()}
    total = sum(medians.values())
    print(f"{n:,} chains, {steps:,} decode steps; load average {os.getloadavg()[0]:.1f}; "
          f"median of {repeats} (the first includes loading the compiled replay)")
    for name, seconds in medians.items():
        print(f"{name:18s} {seconds:6.3f} CPU-s  {100 * seconds / total:4.0f}%")
    print(f"{'all':18s} {total:6.3f} CPU-s  {steps / total / 1e6:.2f}M steps per CPU-second")


def kolibri_json(*args: str) -> dict:
    cmd = [sys.executable, "-m", "kolibri_cli", "probe", *args, "--json"]
    print("+ kolibri probe", " ".join(args), file=sys.stderr, flush=True)
    return json.loads(subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.PIPE).stdout)


def throughput(n: int, repeats: int = 3, proposer: str = "vllm") -> None:
    """`kolibri probe --goldens traces-N` in one process, two processes and on local Ray,
    alternated; the median throughput of each (from the report's throughput block, which times
    the simulation from its first task to its last result: reading, parsing, replaying)."""
    path = str(traces(n))
    setups = {"1 process": ["--workers", "1"], "2 processes": ["--workers", "2"]}
    try:
        import ray  # noqa: F401

        setups["local Ray, 2 CPUs"] = ["--ray", "--workers", "2"]
    except ImportError:
        print("ray not installed: no Ray row (pip install 'kolibri-cli[ray]')", file=sys.stderr)
    runs = {name: [] for name in setups}
    load = []
    for _ in range(repeats):
        for name, args in setups.items():
            load.append(os.getloadavg()[0])
            runs[name].append(kolibri_json("--goldens", path, "--proposer", proposer,
                                           *args)["throughput"])
    print(f"{n:,} chains, {proposer} k=5 window=1-4; load average {min(load):.1f}-{max(load):.1f}")
    for name, results in runs.items():
        median = sorted(results, key=lambda t: t["steps_per_s"])[len(results) // 2]
        print(f"{name:18s} {median['seconds']:6.1f} s  {median['replays_per_s']:8,.0f} chains/s  "
              f"{median['steps_per_s'] / 1e6:5.2f}M steps/s  "
              f"{median['steps_per_cpu_s'] / 1e6:5.2f}M steps per CPU-second")


def peak_rss(args: list[str]) -> int:
    """Peak RSS in MB of `kolibri probe ARGS` and every process it started."""
    code = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
            "stdout=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN)"
            ".ru_maxrss)")
    cmd = [sys.executable, "-c", code, sys.executable, "-m", "kolibri_cli", "probe", *args]
    out = subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True).stdout
    return int(out.strip()) // 1024


def memory() -> None:
    """Peak RSS at 2,000 and 200,000 chains: one process, and the largest of two workers."""
    for workers in ("1", "2"):
        sizes = {n: peak_rss(["--goldens", str(traces(n)), "--workers", workers, "--json"])
                 for n in (2_000, 200_000)}
        print(f"--workers {workers}: peak RSS {sizes[2_000]} MB at 2,000 chains, "
              f"{sizes[200_000]} MB at 200,000 chains")


def probe_with_rss(args: list[str]) -> tuple[dict, int]:
    """`kolibri probe ARGS --json`'s report and its peak RSS in MB (every process it started)."""
    out = BUILD / "probe-report.json"
    code = ("import resource, subprocess, sys; subprocess.run(sys.argv[2:], check=True, "
            "stdout=open(sys.argv[1], 'w')); print(resource.getrusage(resource.RUSAGE_CHILDREN)"
            ".ru_maxrss)")
    cmd = [sys.executable, "-c", code, str(out), sys.executable, "-m", "kolibri_cli", "probe",
           *args, "--json"]
    print("+ kolibri probe", " ".join(args), file=sys.stderr, flush=True)
    rss = subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.read_text()), int(rss.strip()) // 1024


def where(n: int, expr: str) -> None:
    """`kolibri probe --workers 2` over N chains, then the same with --where EXPR: the chains
    simulated, the simulation's wall and CPU seconds (the report's throughput block), the
    peak RSS of the largest process."""
    path = str(traces(n))
    print(f"{n:,} chains, vllm k=5 window=1-4, --workers 2; load average "
          f"{os.getloadavg()[0]:.1f}")
    for extra in ([], ["--where", expr]):
        doc, rss = probe_with_rss(["--goldens", path, "--workers", "2", *extra])
        t = doc["throughput"]
        print(f"{' '.join(extra) or '(all)':32s} {doc['runs'][0]['chains']:>10,} chains  "
              f"{t['seconds']:6.1f} s  {t['cpu_seconds']:6.1f} CPU-s  peak RSS {rss} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    make = sub.add_parser("traces")
    make.add_argument("n", type=int)
    make.add_argument("out", type=Path)
    sub.add_parser("replay")
    speed = sub.add_parser("throughput")
    speed.add_argument("n", type=int, nargs="?", default=200_000)
    speed.add_argument("--repeats", type=int, default=3)
    speed.add_argument("--proposer", default="vllm")
    sub.add_parser("memory")
    sliced = sub.add_parser("where")
    sliced.add_argument("n", type=int, nargs="?", default=1_000_000)
    sliced.add_argument("expr", nargs="?", default="output_tokens >= 100")
    split = sub.add_parser("parts")
    split.add_argument("n", type=int, nargs="?", default=7_000)
    args = parser.parse_args()
    if args.what == "traces":
        write_traces(args.n, args.out)
    elif args.what == "replay":
        replay_speed()
    elif args.what == "throughput":
        throughput(args.n, args.repeats, args.proposer)
    elif args.what == "where":
        where(args.n, args.expr)
    elif args.what == "parts":
        parts(args.n)
    else:
        memory()


if __name__ == "__main__":
    main()
