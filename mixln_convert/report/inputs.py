"""The models ``mixln-convert compare`` puts side by side, from analysis folders (``analysis.json`` of
``mixln-convert analyze``) and train output folders (``recipe.yaml`` and one folder per arm, ``mixln-convert train``).
"""

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import MixLNError
from ..limits import MAX_COMPARED, check_at_most
from ..analysis.result import Analysis
from ..io.records import METRICS, MetricRecord, read_metrics
from ..options import CompareOptions
from ..training.summary import TrainSummary

ARM_KINDS = {"mixln": "Mix-LN", "preln": "Pre-LN", "lns": "LNS"}  # the train command's arm folders
PRUNE_FRACTIONS = {"L/8": 8, "L/4": 4, "L/2": 2}  # removed blocks N = L // d in the pruning table


@dataclass
class Model:
    """One model of the comparison: an analysis, a trained arm, or a trained arm with its analysis."""

    label: str
    source: Path  # the argument it was read from
    analysis: Analysis | None = None
    arm: str | None = None  # "mixln", "preln" or "lns" when ``source`` is a train output folder
    summary: TrainSummary | None = None  # the arm's summary.json; None while the run is unfinished
    metrics: list[MetricRecord] = field(default_factory=list)  # the arm's metrics.jsonl records

    @property
    def layered(self) -> bool:
        """Whether its analysis holds the layer sweep (one made without ``layer_sweep`` has not)."""
        return bool(self.analysis) and self.analysis.layered

    def _layout(self, key: str):
        """The analysis's ``key`` (post_ln_layers, num_layers, layernorm_scaling), else the summary's."""
        if self.analysis:
            return getattr(self.analysis, key)
        return getattr(self.summary, key) if self.summary else None

    @property
    def post_ln_layers(self) -> int | None:
        """Leading Post-LN blocks; None when only an unfinished arm's name tells the kind."""
        return self._layout("post_ln_layers")

    @property
    def kind(self) -> str:
        """'Pre-LN', 'Mix-LN', 'Post-LN' or 'LNS' (LayerNorm Scaling), from the block layout."""
        if self.post_ln_layers is None:
            return ARM_KINDS[self.arm]
        if self._layout("layernorm_scaling"):
            return "LNS"
        num_layers = self._layout("num_layers")
        return "Pre-LN" if self.post_ln_layers == 0 else "Post-LN" if self.post_ln_layers == num_layers else "Mix-LN"

    @property
    def layout(self) -> str:
        """The kind with its Post-LN block count, e.g. 'Mix-LN (3 of 12 blocks Post-LN)', or the scaling of LNS."""
        if self.kind == "LNS":
            return "LNS (Pre-LN, block l's norm outputs x 1/sqrt(l))"
        if self.kind != "Mix-LN" or self.post_ln_layers is None:
            return self.kind
        return f"Mix-LN ({self.post_ln_layers} of {self._layout('num_layers')} blocks Post-LN)"

    def tokens_trained(self) -> int | None:
        if not self.arm:
            return None
        return self.summary.tokens if self.summary else self.metrics[-1].tokens

    def val_ppl(self, when: str) -> float | None:
        """The arm's validation perplexity ``when`` 'initial' or 'final' (the last evaluation so far)."""
        if self.summary:
            return getattr(self.summary, f"{when}_val_ppl")
        final = next((r.val_ppl for r in reversed(self.metrics) if r.val_ppl is not None), None)
        return final if when == "final" else None

    def val_curve(self) -> tuple[list[int], list[float]]:
        """Tokens trained and validation loss at each evaluation, from 0 tokens where the summary has it."""
        points = [(r.tokens, r.val_loss) for r in self.metrics if r.val_loss is not None]
        if self.summary and self.summary.initial_val_loss is not None:
            points.insert(0, (0, self.summary.initial_val_loss))
        return [t for t, _ in points], [v for _, v in points]

    def last_norms(self) -> MetricRecord | None:
        """The last logged training step with the gradient norm of each block."""
        return next((r for r in reversed(self.metrics) if r.grad_norm_per_layer is not None), None)


def load_inputs(paths, labels=()) -> list[Model]:
    """The models of ``paths`` (analysis folders or files, train output folders), labelled by
    ``labels`` (one per path) or by their folder names; a train folder gives one model per arm."""
    check_at_most("INPUTS", len(paths), MAX_COMPARED, "one report's tables and plots hold no more", "inputs")
    if labels and len(labels) != len(paths):
        raise MixLNError(f"{CompareOptions.flag('labels')}: {len(labels)} labels for {len(paths)} inputs; give one per "
                         "input or none")
    models = [m for path, label in zip(map(Path, paths), labels or [None] * len(paths)) for m in _load(path, label)]
    seen = {}
    for model in models:  # two folders of the same name stay apart in legends and tables
        seen[model.label] = seen.get(model.label, 0) + 1
        if seen[model.label] > 1:
            model.label += f" #{seen[model.label]}"
    return models


def _load(path: Path, label: str | None) -> list[Model]:
    if (path.is_file() and path.suffix == ".json") or (path / Analysis.FILE).is_file():
        file = path if path.is_file() else path / Analysis.FILE
        return [Model(label or file.absolute().parent.name, path, analysis=Analysis.read(file))]
    if (path / "recipe.yaml").is_file():
        arms = [arm for arm in ARM_KINDS if (path / arm).is_dir()]
        if not arms:
            raise MixLNError(f"{path}: train output folder without an arm folder ({' or '.join(ARM_KINDS)})")
        return [_load_arm(path, arm, f"{label or path.absolute().name}/{arm}") for arm in arms]
    if not path.exists():
        raise MixLNError(f"{path}: no such file or folder")
    is_checkpoint = (path / "config.json").is_file() or path.suffix == ".gguf"
    hint = f"; run `mixln-convert analyze {path}` and compare its output" if is_checkpoint else ""
    raise MixLNError(f"{path}: neither an analysis (no analysis.json) nor a train output folder (no recipe.yaml){hint}")


def _load_arm(run: Path, arm: str, label: str) -> Model:
    folder = run / arm
    file = folder / METRICS
    metrics = read_metrics(file) if file.is_file() else []
    if not metrics:
        raise MixLNError(f"{file}: no training metrics (has the {arm} arm started training?)")
    file = folder / TrainSummary.FILE
    summary = TrainSummary.read(file) if file.is_file() else None
    analysis_file = folder / "analysis" / Analysis.FILE
    analysis = Analysis.read(analysis_file) if analysis_file.is_file() else None
    return Model(label, run, analysis=analysis, arm=arm, summary=summary, metrics=metrics)


