"""Evolutionary search under a MAC budget (ViT-ResNAS §2.3, §3.1)."""

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
        after each round, the initial population first) and `evaluated`
        (number of distinct candidates scored).
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

    def best_keys(count):
        return sorted(scores, key=scores.get, reverse=True)[:count]

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
    return {
        "architecture": archs[best],
        "score": scores[best],
        "macs": macs(archs[best]),
        "history": history,
        "evaluated": len(scores),
    }
