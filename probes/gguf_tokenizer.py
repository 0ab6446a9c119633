"""How long a deployment GGUF's tokenizer takes to be ready when only its metadata is read: a
40 GB GGUF (the default model's tokenizer, a 70B-like llama's tensor infos, the tensor data a
sparse hole written by store/synthetic.write_sparse) opened as `-m FILE.gguf` is where kolibri
only tokenizes, against the `gguf` library's reader opening the same file, in one run.

    python probes/gguf_tokenizer.py [--repeats 3]    # alone on the machine
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    import gguf

    from kolibri_cli.store import cache
    from kolibri_cli.store.models import open_tokenizer
    from kolibri_cli.store.synthetic import write_sparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    source = cache.gguf_file(cache.pull(cache.DEFAULT_MODEL))
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "deployment.gguf"
        write_sparse(big, source)
        ours = timed(lambda: open_tokenizer(str(big)), args.repeats)
        theirs = timed(lambda: gguf.GGUFReader(str(big)), args.repeats)
        size = big.stat().st_size
    print(f"GGUF of {size / 1e9:.1f} GB (tensor data a sparse hole), medians of {args.repeats}:")
    print(f"  kolibri, -m FILE.gguf where it only tokenizes (metadata): {ours:.2f} s")
    print(f"  gguf.GGUFReader (metadata and tensor infos):             {theirs:.2f} s")
    print(f"  ratio: {theirs / ours:.1f}x")


if __name__ == "__main__":
    main()
