"""Peak memory (RSS) and prefill time of `kolibri generate` on the default model, one fresh
process per case, so each peak is that case's alone.

Cases: a 1-token raw prompt; an N-token raw prompt (default 8000, the default model's context is
8192), both with -n 1; and "hi" with -n N, whose KV cache is sized for N positions but barely
written. Prints prompt tokens, prefill ms, peak RSS (ru_maxrss of the child) and the child's
CPU seconds (user + system: less sensitive to other load than wall time);
--repeats runs every case that many times, alternating, and prints medians. A first
unmeasured run compiles the kernel (or loads it) so no case pays for that.

    .venv/bin/python probes/memory_bench.py [--tokens 8000] [--repeats 3] [--model NAME]
"""

import argparse
import json
import os
import statistics
import sys

WORDS = ("river stone lamp orange window quiet paper seven garden cloud tiger silver music "
         "engine forest bread yellow ocean pencil mirror").split()


def long_prompt(n_words: int) -> str:
    """About one token per word: common words, deterministic order."""
    return " ".join(WORDS[(i * 7 + i // 20) % len(WORDS)] for i in range(n_words))


def measure(args: list[str], stdin: str) -> tuple[int, float, float, float]:
    """(prompt tokens, prefill ms, peak RSS MB, CPU s) of one process."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: stdin from the pipe, stdout to a file we read back
        os.close(w)
        os.dup2(r, 0)
        out = os.open(OUT, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1)
        err = os.open(os.devnull, os.O_WRONLY)
        os.dup2(err, 2)
        os.execv(sys.executable, [sys.executable, "-m", "kolibri_cli", "generate", "--json",
                                  *args])
    os.close(r)
    with os.fdopen(w, "w") as f:
        f.write(stdin)
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"error: kolibri generate {' '.join(args)} exited "
                 f"{os.waitstatus_to_exitcode(status)}")
    with open(OUT) as f:
        stats = json.load(f)["stats"]
    cpu = usage.ru_utime + usage.ru_stime
    return stats["prompt_tokens"], stats["prefill_s"] * 1e3, usage.ru_maxrss / 1024, cpu


OUT = f"/tmp/kolibri-memory-bench-{os.getpid()}.json"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=8000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", default=None)
    a = p.parse_args()
    model = ["--model", a.model] if a.model else []
    cases = {
        "1-token prompt, -n 1": (["--raw", "-n", "1", *model, "-"], "river"),
        f"{a.tokens}-token prompt, -n 1": (["--raw", "-n", "1", *model, "-"],
                                           long_prompt(a.tokens)),
        f'"hi", -n {a.tokens}': (["-n", str(a.tokens), *model, "-"], "hi"),
    }
    results: dict[str, list[tuple[int, float, float, float]]] = {name: [] for name in cases}
    try:
        measure(["--raw", "-n", "1", *model, "-"], "warm")  # compiling peaks higher: not counted
        for _ in range(a.repeats):
            for name, (args, stdin) in cases.items():
                results[name].append(measure(args, stdin))
    finally:
        if os.path.exists(OUT):
            os.remove(OUT)
    print(f"{'case':<28} {'prompt tokens':>13} {'prefill ms':>11} {'peak RSS MB':>12} "
          f"{'process CPU s':>14}")
    for name, rows in results.items():
        prefill, rss, cpu = (statistics.median(r[i] for r in rows) for i in (1, 2, 3))
        print(f"{name:<28} {rows[0][0]:>13} {prefill:>11.0f} {rss:>12.0f} {cpu:>14.1f}")


if __name__ == "__main__":
    main()
