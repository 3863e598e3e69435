"""Ratios over interleaved rounds, shared by the benchmark scripts."""

import statistics


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
