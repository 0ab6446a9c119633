"""c(n): the cost of an n-token forward pass relative to a 1-token pass."""

from collections.abc import Callable

from kolibri_cli.errors import KolibriError

DEFAULT_COST_SLOPE = 0.06  # c(n) = 1 + slope (n - 1) when nothing was measured: c(6) = 1.30


def cost_model(costs: dict[int, float] | None) -> Callable[[int], float]:
    """c(n), the cost of an n-token forward relative to a 1-token forward, from measured costs
    (any unit; divided by costs[1]); n beyond the measured range extrapolates the last slope.
    Without measurements: the default model c(n) = 1 + DEFAULT_COST_SLOPE * (n - 1), between the
    target c(6) <= 1.25 set for the float32 kernel and its prototype's measured 1.42."""
    if not costs:
        return lambda n: 1.0 + DEFAULT_COST_SLOPE * (n - 1)
    if 1 not in costs:
        raise KolibriError("costs need c(1), the 1-token forward; measure c(n) from n = 1")
    rel = {n: c / costs[1] for n, c in sorted(costs.items())}
    top = max(rel)
    below = max((n for n in rel if n < top), default=None)
    slope = DEFAULT_COST_SLOPE if below is None else (rel[top] - rel[below]) / (top - below)

    def c(n: int) -> float:
        return rel[n] if n in rel else rel[top] + slope * (n - top)

    return c



def line_slope(costs: dict[int, float]) -> float:
    """The slope a of the least-squares line c(n) = 1 + a (n - 1) through measured `costs` (any
    unit; divided by costs[1]): the line goes through c(1) = 1, which holds by definition."""
    if 1 not in costs:
        raise KolibriError("costs need c(1), the 1-token forward; measure c(n) from n = 1")
    points = [(n - 1, c / costs[1] - 1) for n, c in costs.items() if n > 1]
    if not points:
        return 0.0
    return sum(x * y for x, y in points) / sum(x * x for x, _ in points)
