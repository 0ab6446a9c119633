"""Benchmarks as functions: bandwidth and forward timings (`timing`), `kolibri bench`'s run
(`run`), and the bench chain (`chain`)."""
