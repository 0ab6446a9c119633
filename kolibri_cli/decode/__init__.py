"""Decoding: the plain and speculative generators, the draft proposers, and the cost model c(n)."""
