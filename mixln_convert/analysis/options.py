"""The analysis's settings (``mixln-convert analyze``: analysis/analyze.py). Torch-free."""

from dataclasses import dataclass

from ..errors import MixLNError
from ..evaluation.options import TASKS_HELP, EvalOptions
from ..limits import MAX_TASKS
from ..options import Output
from ..schema import Choice, Count, Flag, Names, same_as, setting

METHODS = ("angular", "drop", "last")  # analysis/choice.py: how N blocks to remove are chosen
METHODS_HELP = ("angular (the N consecutive blocks whose input and output are closest in angle, Gromov et al.), "
                "drop (the N whose single removal costs least), last (the N deepest).")


@dataclass(frozen=True, kw_only=True)
class AnalyzeOptions(EvalOptions):
    """``mixln-convert analyze``'s options (analysis/analyze.py): EvalOptions', ``tasks`` measured per block."""
    tasks: tuple[str, ...] = setting((), Names(low=0, high=MAX_TASKS), "Also the layer drop on each task's metric "
                                     "(the first its YAML lists): the metric with block l skipped minus the full "
                                     "model's, in memory. " + TASKS_HELP, flag="--task", metavar="T1,T2")
    span: int = setting(1, Count(1), "n of the per-layer angular distance, between the inputs of blocks l and l+n.")
    layer_sweep: bool = setting(True, Flag(), "The per-block measures (skipping each block, angular distances, "
                                "gradient norms: L forwards and a backward pass); without it, perplexity and what "
                                "--generate and --per-document add.", flag="--layer-sweep/--no-layer-sweep")
    prune_curve: bool = setting(False, Flag(), "Also the perplexity with N = 1..L/2 blocks removed by --method.")
    method: str = setting("angular", Choice(METHODS), "How --prune-curve chooses the N blocks it removes: "
                          + METHODS_HELP)

    def check_combination(self):
        super().check_combination()
        if not self.layer_sweep and (self.prune_curve or self.tasks):
            given = self.flag("prune_curve" if self.prune_curve else "tasks")
            raise MixLNError(f"{given} ranks or drops blocks by the layer sweep, which --no-layer-sweep skips")


@dataclass(frozen=True, kw_only=True)
class AnalyzeOutput(Output):
    out: str | None = same_as(Output, "out", default=None, default_help="analysis-<CKPT name>")
