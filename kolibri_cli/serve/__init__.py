"""`kolibri serve`: the model behind an OpenAI-compatible HTTP API, speculating by default and
never changing the text — the same request gives the same ids with speculation on or off, and
the same as `kolibri generate`.

Layout: `requests` turns request bodies into what the generators need (every bad field a 4xx),
`responses` builds the answers, `worker` runs generations one at a time behind a bounded queue,
`metrics` counts them in Prometheus form (vLLM's names beside kolibri's own), `tokens` answers
/tokenize and /detokenize, `app` is the ASGI app (Starlette), `connections` bounds idle
connections, `run` puts it on uvicorn. The server stack is the optional `serve` extra, imported
only here.
Non-goals: batching several sequences (one at a time through one worker), tools, images, TLS
(put a proxy in front).
"""

from importlib.util import find_spec

from kolibri_cli.errors import KolibriError

EXTRA = "pip install 'kolibri-cli[serve]'"
_NEEDS = ("starlette", "uvicorn", "prometheus_client")


def check_installed() -> None:
    """A KolibriError naming the pip command when the serve extra is missing."""
    missing = [name for name in _NEEDS if find_spec(name) is None]
    if missing:
        raise KolibriError(f"kolibri serve needs {', '.join(missing)}: {EXTRA} (or, in a "
                           "checkout, pip install -e '.[serve]')")
