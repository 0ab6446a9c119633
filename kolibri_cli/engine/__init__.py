"""The engine: a model's config, weights, tokenizer and the one forward kernel. Knows nothing of
the cache, the terminal or speculation; importable without typer or rich."""
