"""Evolutionary search under a MAC budget (ViT-ResNAS §2.3, §3.1)."""

import math

from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.nas.search_space import SearchSpace
from keras_jumbo.nas.search_space import as_rng


def evolutionary_search(
    space,
    evaluate,
    mac_budget,
    *,
    population_size=500,
    num_parents=75,
    num_children=150,
    mutation_probability=0.3,
    iterations=20,
    lower_ratio=0.975,
    image_size=224,
    num_classes=1000,
    max_tries=100_000,
    seed=0,
    log=None,
):
    """Search `space` for the best sub-network within a MAC budget.

    Only sub-networks with MACs in `[lower_ratio * C, C]` are considered
    (§3.1). An initial population of `population_size` random candidates
    is evaluated; then, for `iterations` rounds, the `num_parents` best of
    the population produce `num_children` new candidates, half by mutation
    (one parent, each dimension resampled with `mutation_probability`) and
    half by crossover (two parents, each dimension from either), which are
    evaluated and added to the population. Defaults are the paper's
    (P0=500, 75 parents, 150 children, p=0.3, 20 iterations).

    A candidate whose score is not finite (NaN from a diverged
    sub-network, or inf) ranks below every finite one and is never
    returned; if every candidate scores so, the search raises.

    Args:
        space: a `SearchSpace`.
        evaluate: callable `arch -> score` (higher is better), e.g.
            `lambda a: evaluate_subnet(supernet, space, a, x_val, y_val)`.
        mac_budget: C, MACs of one image.
        image_size, num_classes: for counting MACs.
        max_tries: attempts to draw valid candidates before giving up.
        seed: int or numpy Generator.
        log: optional callable receiving progress strings.

    Returns:
        dict with `architecture`, `score`, `macs`, `history` (best score
        after each round, the initial population first; NaN while no
        candidate has a finite score), `evaluated` (number of distinct
        candidates scored) and `non_finite` (how many of them scored NaN
        or inf).
    """
    if not isinstance(space, SearchSpace):
        raise TypeError(
            f"`space` must be a SearchSpace. Received: {type(space).__name__}"
        )
    for arg, value in (
        ("population_size", population_size),
        ("num_parents", num_parents),
        ("iterations", iterations),
    ):
        check_positive_int(arg, value, allow_zero=arg == "iterations")
    check_positive_int("num_children", num_children, allow_zero=True)
    if num_parents > population_size:
        raise ValueError(
            "`num_parents` must be <= `population_size` (parents are drawn "
            f"from the population). Received: num_parents={num_parents}, "
            f"population_size={population_size}"
        )
    if isinstance(mutation_probability, bool) or not isinstance(
        mutation_probability, (int, float)
    ):
        raise TypeError(
            "`mutation_probability` must be a float in [0, 1]. Received: "
            f"mutation_probability={mutation_probability!r}"
        )
    if not 0.0 <= mutation_probability <= 1.0:
        raise ValueError(
            "`mutation_probability` must be in [0, 1]. Received: "
            f"mutation_probability={mutation_probability}"
        )
    if not 0.0 < lower_ratio <= 1.0:
        raise ValueError(
            f"`lower_ratio` must be in (0, 1]. Received: {lower_ratio}"
        )
    rng = as_rng(seed)

    def macs(arch):
        return space.count_macs(arch, image_size, num_classes)

    smallest = macs(space.smallest())
    if mac_budget < smallest:
        raise ValueError(
            "`mac_budget` is smaller than the smallest sub-network of the "
            f"space ({smallest} MACs). Received: mac_budget={mac_budget}"
        )
    lower = lower_ratio * mac_budget

    def admissible(arch):
        return lower <= macs(arch) <= mac_budget

    scores = {}
    archs = {}

    def add(arch):
        key = space.key(arch)
        if key in scores or not admissible(arch):
            return False
        archs[key] = arch
        scores[key] = float(evaluate(arch))
        return True

    tries = 0
    while len(scores) < population_size:
        if tries >= max_tries:
            if not scores:
                raise ValueError(
                    "No sub-network found with MACs in "
                    f"[{lower:.0f}, {mac_budget}] after {max_tries} draws; "
                    "widen `lower_ratio` or change `mac_budget`. Received: "
                    f"mac_budget={mac_budget}"
                )
            break
        tries += 1
        add(space.sample(rng))

    def rank(key):
        # Non-finite scores (diverged sub-networks) rank last.
        score = scores[key]
        return (1, score) if math.isfinite(score) else (0, 0.0)

    def best_keys(count):
        return sorted(scores, key=rank, reverse=True)[:count]

    history = [scores[best_keys(1)[0]]]
    if log:
        log(f"initial population {len(scores)}: best {history[-1]:.4f}")
    for iteration in range(iterations):
        parents = [archs[k] for k in best_keys(num_parents)]
        made, tries = 0, 0
        while made < num_children and tries < max_tries:
            tries += 1
            if made < num_children // 2 or len(parents) < 2:
                parent = parents[int(rng.integers(len(parents)))]
                child = space.mutate(parent, rng, mutation_probability)
            else:
                i, j = rng.choice(len(parents), size=2, replace=False)
                child = space.crossover(parents[i], parents[j], rng)
            made += add(child)
        history.append(scores[best_keys(1)[0]])
        if log:
            log(
                f"iteration {iteration + 1}/{iterations}: {made} children, "
                f"best {history[-1]:.4f}"
            )
    best = best_keys(1)[0]
    non_finite = sum(not math.isfinite(v) for v in scores.values())
    if not math.isfinite(scores[best]):
        raise ValueError(
            f"Every one of the {len(scores)} candidates scored a non-finite "
            "value (NaN or inf), so there is no best sub-network; check "
            "the super-network's training (a diverged run) or `evaluate`. "
            f"Received: scores such as {scores[best]}"
        )
    return {
        "architecture": archs[best],
        "score": scores[best],
        "macs": macs(archs[best]),
        "history": history,
        "evaluated": len(scores),
        "non_finite": non_finite,
    }
