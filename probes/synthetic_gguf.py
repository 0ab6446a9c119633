"""Write a Llama-3-8B-shaped Q4_K_M GGUF of random blocks (32 layers, d 4096, FFN 14336, 32/8
heads, vocab 128256; ~4.9 GB, ~20 s) to measure a model of that size on this machine.

    .venv/bin/python probes/synthetic_gguf.py OUT.gguf [--layers 32] [--seed 0]
    kolibri model import OUT.gguf && kolibri bench --model OUT --peer llama.cpp --prefill 0
"""

import argparse

from kolibri_cli.store import synthetic


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    synthetic.write(args.out, n_layers=args.layers, seed=args.seed)


if __name__ == "__main__":
    main()
