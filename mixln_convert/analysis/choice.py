"""The rules that choose which N decoder blocks to remove (``METHODS``), for ``prune`` and ``analyze``'s
pruning curve: ``angular`` (Gromov et al. 2024), the N consecutive blocks l..l+N-1 whose input x_l and
output x_{l+N} are closest by token-averaged angular distance; ``drop``, the N blocks whose removal
alone raises perplexity least; ``last``, the N deepest blocks."""

from ..errors import MixLNError
from ..schema import Choice
from ..surgery.options import PruneOptions
from .options import METHODS


def check_count(n: int, num_layers: int) -> None:
    if not 1 <= n < num_layers:
        raise MixLNError(f"{PruneOptions.flag('remove')}: {n} layers is outside [1, {num_layers - 1}] for this "
                         f"{num_layers}-layer model")


def choose_layers(method: str, n: int, num_layers: int, scores: dict | None = None) -> list[int]:
    """The ``n`` blocks ``method`` removes. ``scores`` holds what the method ranks by:
    ``angular_distance_matrix`` (angular) or ``layer_drop`` (drop); see :func:`layer_scores`."""
    Choice(METHODS).check(PruneOptions.flag("method"), method)
    check_count(n, num_layers)
    if method == "angular":
        distances = span_distances(scores["angular_distance_matrix"], n)
        start = min(range(len(distances)), key=distances.__getitem__)
        return list(range(start, start + n))
    if method == "drop":
        return sorted(sorted(range(num_layers), key=scores["layer_drop"].__getitem__)[:n])
    return list(range(num_layers - n, num_layers))


def span_distances(angular_distance_matrix: list[list[float]], n: int) -> list[float]:
    """Angular distance between the input and the output of blocks l..l+n-1, for each start l."""
    return [row[n - 1] for row in angular_distance_matrix if len(row) >= n]


def layer_scores(model, windows, method: str, batch_size: int = 4, progress: bool = True) -> dict:
    """What ``method`` (angular or drop) ranks blocks by, measured with ``model`` on ``windows`` (token ids)."""
    from .layers import BlockRunner, RepresentationStatistics, removal_sweep  # torch: only when measuring

    runner = BlockRunner(model)
    if method == "angular":
        statistics = RepresentationStatistics(runner.num_layers)
        removal_sweep(runner, windows, batch_size=batch_size, statistics=statistics, progress=progress)
        return {"angular_distance_matrix": statistics.angular_distance_matrix()}
    sweep = removal_sweep(runner, windows, [[l] for l in range(runner.num_layers)], batch_size, progress=progress)
    return {"layer_drop": [p - sweep.perplexity for p in sweep.removed]}
