"""Timing, ratios over interleaved rounds and output differences, shared
by the benchmark scripts."""

import statistics
import time


def median_ms(function, *args, calls=21):
    """The median milliseconds of `calls` calls of `function(*args)` (a
    JAX function), each waited for (`jax.block_until_ready`), after one
    call that compiles and warms it."""
    import jax

    jax.block_until_ready(function(*args))
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(function(*args))
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def largest_relative_difference(a, b):
    """The largest `|a - b|` over the leaves of two pytrees of arrays of
    the same structure, each relative to its leaf's largest `|a|`."""
    import jax
    import numpy as np

    worst = 0.0
    for left, right in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        left, right = np.asarray(left), np.asarray(right)
        scale = max(float(np.abs(left).max()), 1e-30)
        worst = max(worst, float(np.abs(left - right).max()) / scale)
    return worst


def round_ratio(rates, base_rates):
    """The median over rounds of `rate / base rate` in the same round, or
    None without a reference measured in every round. A round's
    contenders run one after another, so a slow phase of the machine that
    lasts a round or two moves both sides of its ratio; the ratio of the
    medians can pair a contender's fast round with the reference's slow
    one."""
    if not base_rates or len(base_rates) != len(rates):
        return None
    return statistics.median(
        rate / base for rate, base in zip(rates, base_rates, strict=True)
    )
