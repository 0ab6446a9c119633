"""kolibri: measure whether n-gram speculative decoding speeds up a model on a CPU."""

__version__ = "0.1.0"
