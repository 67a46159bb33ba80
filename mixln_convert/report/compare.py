"""``compare()``: the numbers that put models side by side, and a plain-language summary made from them.

The Mix-LN paper (arXiv 2412.13795) expects Mix-LN's deep blocks to matter more and its gradients to be more
uniform than Pre-LN's, its successor LayerNorm Scaling (LNS, arXiv 2502.05795) the deep blocks to matter more
and a lower perplexity; the summary says whether these models show it.
"""

import json
from dataclasses import dataclass

import numpy as np

from ..analysis.measures import coefficient_of_variation, deep_half
from ..analysis.options import AnalyzeOptions
from ..analysis.result import Analysis
from ..errors import MixLNError
from ..evaluation.options import Evaluated, Measured, measured_on
from ..io.paths import check_destination
from ..io.records import NUMBER, PAIR, STRINGS, Record, Result
from ..options import OUT, CompareOptions
from ..schema import (NONNEGATIVE, POSITIVE_NUMBER, TOKENS_OR_ZERO, ByName, Flag, Kind, Nested, String, read_record,
                      setting)
from ..training.summary import MEASURED_ON
from . import uncertainty
from .inputs import ARM_KINDS, PRUNE_FRACTIONS, Model, load_inputs
from .downstream import DocumentFigures, TaskNumbers, beside_layer_drop, downstream_numbers, plot_task_drops
from .uncertainty import LEVEL, MIN_ROWS, PRACTICAL, Bootstrap, bootstrap, call

PRUNE_VERDICT = "L/4"  # the pruning sentence compares models at this many removed blocks

# How a difference between two models' figures is measured against PRACTICAL: the ratio of perplexities
# less 1, the difference of figures that are already fractions of a model's perplexity, or the difference
# relative to the larger figure
RATIO, POINTS, RELATIVE = "ratio", "points", "relative"
OF = {RATIO: "of perplexity", POINTS: "of perplexity", RELATIVE: "of the larger value"}
NO_VALUES = "no per-window values to bootstrap an interval from"
ARM_FIELDS = ("arm", "tokens_trained", "initial_val_ppl", "final_val_ppl", "wall_time_s", "finished", "validation")


# kw_only: the fields keep the file's order. A figure the model's inputs do not give is None and left out of the
# file, but for an arm each of ARM_FIELDS is written
@dataclass(frozen=True, kw_only=True)
class ModelNumbers(Record):
    """One model's numbers the report compares (:func:`model_numbers`)."""
    label: str = setting(kind=String())
    kind: str = setting(kind=String())
    layout: str = setting(kind=String())
    source: str = setting(kind=String())
    arm: str | None = setting(None, String())
    tokens_trained: int | None = setting(None, TOKENS_OR_ZERO)
    initial_val_ppl: float | None = setting(None, POSITIVE_NUMBER)
    final_val_ppl: float | None = setting(None, POSITIVE_NUMBER)
    wall_time_s: float | None = setting(None, NONNEGATIVE)
    finished: bool | None = setting(None, Flag())
    validation: Measured | None = setting(None, MEASURED_ON)
    training_grad_norm_cv: float | None = setting(None, NUMBER)  # the last logged training step's
    perplexity: float | None = setting(None, POSITIVE_NUMBER)
    evaluation: Evaluated | None = setting(None, Nested(Evaluated, "what a figure was measured on"))
    deep_layer_drop: float | None = setting(None, NUMBER)
    deep_layer_drop_median: float | None = setting(None, NUMBER)
    deep_layer_drop_relative: float | None = setting(None, NUMBER)
    deep_layer_drop_top: list | None = setting(None, Kind())  # [block, its share of the total or None]
    deep_angular_distance: float | None = setting(None, NUMBER)
    grad_norm_cv: float | None = setting(None, NUMBER)
    repeated_4gram_share: float | None = setting(None, NUMBER)
    prune_method: str | None = setting(None, String())
    prune: dict | None = setting(None, ByName(PAIR, or_none=True))  # PRUNE_FRACTIONS name -> [blocks removed, ppl]
    intervals: dict = setting(kind=ByName(PAIR))  # figure -> [low, high]
    interval_n: dict = setting(kind=ByName(String()))  # figure -> what its interval rests on
    tasks: dict | None = setting(None, ByName(Nested(TaskNumbers, "a task's numbers")))
    per_document: DocumentFigures | None = setting(None, Nested(DocumentFigures, "per-document scores"))

    def to_dict(self) -> dict:
        return {key: value for key, value in super().to_dict().items()
                if value is not None or (self.arm is not None and key in ARM_FIELDS)}


@dataclass(frozen=True)
class Comparison(Result):
    """What :func:`compare` says, as ``comparison.json`` holds it."""
    FILE = "comparison.json"
    WHAT = "a comparison of `mixln-convert compare`"

    summary: list[str] = setting(kind=STRINGS)  # the sentences of the report's summary
    notes: list[str] = setting(kind=STRINGS)  # warnings (analyses made with different tokenizers)
    models: list[ModelNumbers] = setting(kind=Nested(ModelNumbers, "a model's numbers", many=True))


def compare(inputs, out, options: CompareOptions | None = None, *, force: bool = False, **settings) -> Comparison:
    """Write a report comparing ``inputs`` (analysis folders or files, train output folders) into ``out``:
    report.md, report.html (figures embedded), the PNGs and comparison.json; returns the :class:`Comparison`.
    ``options``: a :class:`~mixln_convert.options.CompareOptions`, or
    its fields as ``settings``. Analyses made with different tokenizers are refused unless ``allow_mismatch``."""
    options = CompareOptions.given(options, settings)
    from ..io.atomic import atomic_output_dir
    from .plots import plot_report
    from .render import write_report
    from .tables import report_blocks

    protect = {f"#{i + 1}": path for i, path in enumerate(inputs)}
    check_destination(out, protect, force, flag=OUT)
    models = load_inputs(inputs, options.labels)
    notes = check_tokenizers(models, options.allow_mismatch)
    estimates = {m.label: model_estimates(m) for m in models}
    numbers = {m.label: model_numbers(m, estimates[m.label]) for m in models}
    summary = _training_sentences(models, numbers, estimates) + _analysis_sentences(models, numbers, estimates)
    result = Comparison(summary, notes, list(numbers.values()))
    with atomic_output_dir(out, force=force, protect=protect) as tmp:
        images = beside_layer_drop(plot_report(models, tmp), plot_task_drops(models, tmp))
        write_report(tmp, report_blocks(models, numbers, summary, notes, images))
        result.write(tmp)
    return result


def check_tokenizers(models: list[Model], allow_mismatch: bool) -> list[str]:
    """[] when every analysis used one tokenizer (by vocabulary size); else a warning with
    ``allow_mismatch``, an error without."""
    sizes = {m.label: m.analysis.tokenizer_vocab_size for m in models
             if m.analysis and m.analysis.tokenizer_vocab_size is not None}
    if len(set(sizes.values())) < 2:
        return []
    listed = ", ".join(f"{label} {size}" for label, size in sizes.items())
    message = f"the analyses used different tokenizers (vocabulary sizes {listed}): perplexities are not comparable"
    if not allow_mismatch:
        raise MixLNError(f"inputs: {message}; pass {CompareOptions.flag('allow_mismatch')} to compare anyway")
    return [message]


def prune_points(analysis: Analysis) -> dict:
    """{'L/8': (N, perplexity with N blocks removed) or None, ...} from the analysis's prune curve."""
    curve, num_layers = analysis.prune_curve, analysis.num_layers
    measured = dict(zip(curve.removed, curve.perplexity))
    return {name: (n, measured[n]) if (n := num_layers // d) in measured else None
            for name, d in PRUNE_FRACTIONS.items()}


def model_estimates(model: Model) -> dict[str, Bootstrap]:
    """Bootstrap estimates of the figures the summary compares, where the inputs hold the
    per-window values (analyses and training runs of this version do)."""
    estimates = {}
    summary = model.summary
    if summary and summary.validation and summary.final_val_window_losses:
        estimates["final_val_ppl"] = bootstrap(uncertainty.perplexity, summary.final_val_window_losses,
                                              measured_on(summary.validation))
    analysis = model.analysis
    if not (analysis and analysis.per_window is not None):
        return estimates
    per_window, deep = analysis.per_window, deep_half(analysis.num_layers)
    where = measured_on(analysis.evaluation())
    loss = np.asarray(per_window.loss)[:, None]
    estimates["perplexity"] = bootstrap(uncertainty.perplexity, loss[:, 0], where)
    if not model.layered:
        return estimates
    estimates["deep_layer_drop_relative"] = bootstrap(
        uncertainty.relative_increase, np.hstack([loss, np.asarray(per_window.loss_without_layer)[:, deep]]), where)
    estimates["deep_angular_distance"] = bootstrap(uncertainty.mean_value,
                                                  np.asarray(per_window.angular_distance)[:, deep], where)
    estimates["grad_norm_cv"] = bootstrap(uncertainty.variation_of_mean, per_window.grad_norm_per_layer,
                                         where + " (gradient batches)", rows="gradient batches")
    curve = analysis.prune_curve
    n = analysis.num_layers // PRUNE_FRACTIONS[PRUNE_VERDICT]
    if curve and curve.window_losses is not None and n in curve.removed:
        pruned = np.asarray(curve.window_losses[curve.removed.index(n)])[:, None]
        estimates["prune_ratio"] = bootstrap(uncertainty.relative_increase, np.hstack([loss, pruned]), where)
    return estimates


def model_numbers(model: Model, estimates: dict[str, Bootstrap]) -> ModelNumbers:
    """The numbers of ``model`` the report compares (None where the input does not have them),
    with the 95% bootstrap interval of each figure that has ``estimates``."""
    numbers = {"label": model.label, "kind": model.kind, "layout": model.layout, "source": str(model.source)}
    if model.arm:
        numbers.update(arm=model.arm, tokens_trained=model.tokens_trained(),
                       initial_val_ppl=model.val_ppl("initial"), final_val_ppl=model.val_ppl("final"),
                       wall_time_s=model.summary and model.summary.wall_time_s, finished=bool(model.summary),
                       validation=model.summary and model.summary.validation)
        if last := model.last_norms():
            numbers.update(training_grad_norm_cv=float(coefficient_of_variation(last.grad_norm_per_layer)))
    if analysis := model.analysis:
        numbers.update(perplexity=analysis.perplexity, evaluation=analysis.evaluation())
        if model.layered:  # what the layer sweep says of the deeper half of the blocks
            deep = deep_half(analysis.num_layers)
            drops = np.asarray(analysis.layer_drop[deep])
            numbers.update(
                deep_layer_drop=float(drops.mean()),
                deep_layer_drop_median=float(np.median(drops)),
                deep_layer_drop_relative=float(drops.mean()) / analysis.perplexity,
                # the block that carries the mean, and its share of the deep blocks' summed increase
                deep_layer_drop_top=[int(drops.argmax()) + deep.start,
                                     float(drops.max() / drops.sum()) if drops.sum() > 0 else None],
                # span 1 (consecutive block inputs) whatever --span the analysis was made with
                deep_angular_distance=float(np.mean([row[0] for row in analysis.angular_distance_matrix[deep]])),
                grad_norm_cv=float(coefficient_of_variation(analysis.grad_norm_per_layer)),
            )
        if analysis.generation is not None:
            numbers.update(repeated_4gram_share=analysis.generation.repeated_4gram_share)
        if analysis.prune_curve is not None:
            numbers.update(prune_method=analysis.prune_curve.method, prune=prune_points(analysis))
    numbers.update(intervals={name: e.interval for name, e in estimates.items()},
                   interval_n={name: e.size for name, e in estimates.items()})  # what each interval rests on
    numbers.update(downstream_numbers(model))
    # as comparison.json holds them (a tuple a list, a key a string): what compare() returns is the file
    return read_record(ModelNumbers, json.loads(json.dumps(numbers, default=Record.to_dict)), Comparison.FILE)


def _with_interval(text: str, found: Bootstrap | None, bound=lambda x: f"{x:.3g}") -> str:
    """``text`` with the interval of ``found`` and what it rests on: '0.268 [0.257, 0.283; n=8 windows]'."""
    if found is None:
        return text
    low, high = found.interval
    return f"{text} [{bound(low)}, {bound(high)}; {found.size}]"


def _and(labels: list[str]) -> str:
    return labels[0] if len(labels) == 1 else f"{', '.join(labels[:-1])} and {labels[-1]}"


def judge(scale: str, a: float, b: float, found_a: Bootstrap | None = None, found_b: Bootstrap | None = None,
          unbootstrapped: str = NO_VALUES) -> tuple[str, str]:
    """(outcome, why) of figure ``a`` against ``b`` (see :func:`uncertainty.call`: 'differs', 'same' or
    'open'), their difference measured by ``scale`` (RATIO, POINTS or RELATIVE); ``why`` says what an
    outcome other than 'differs' rests on ('' where the interval decided it; ``unbootstrapped`` where
    there is no interval)."""
    larger = max(abs(a), abs(b)) or 1.0
    difference = {RATIO: a / b - 1 if b else np.inf, POINTS: a - b, RELATIVE: (a - b) / larger}[scale]
    if found_a is None or found_b is None:
        return call(difference), unbootstrapped
    if not (found_a.decides and found_b.decides):
        few = found_a if found_a.n <= found_b.n else found_b
        return call(difference), f"the interval rests on {few.size}, too few (under {MIN_ROWS}) to decide"
    draws = {RATIO: found_a.draws / found_b.draws - 1, POINTS: found_a.draws - found_b.draws,
             RELATIVE: (found_a.draws - found_b.draws) / larger}[scale]
    outcome = call(difference, draws)
    low, high = uncertainty.interval(draws)
    if outcome != "open":
        return outcome, ""
    if low <= 0 <= high:
        return outcome, f"the {LEVEL:.0%} bootstrap interval of their difference over {found_a.size} includes 0"
    return outcome, (f"their difference is within {PRACTICAL:.0%} {OF[scale]} but its {LEVEL:.0%} bootstrap "
                     f"interval over {found_a.size} reaches past it")


def _ranking(what: str, shown: dict, values: dict, verdict: str, highest: bool, found: dict, scale: str,
             unbootstrapped: str = NO_VALUES) -> str:
    """'<what>: A 1.0 [interval], B 2.0; <verdict naming the best>.', the best having the highest (or lowest)
    of ``values``; the verdict only where the best differs from every other model (:func:`judge`; ``found``:
    label -> Bootstrap); otherwise which models are the same within PRACTICAL, or too close to call, and why."""
    listed = ", ".join(f"{label} {text}" for label, text in shown.items())
    if len(values) < 2:
        return f"{what}: {listed} (only one model to show)."
    best = max(values, key=values.get) if highest else min(values, key=values.get)
    judged = {label: judge(scale, values[label], values[best], found.get(label), found.get(best), unbootstrapped)
              for label in values if label != best}
    if all(outcome == "differs" for outcome, _ in judged.values()):
        return f"{what}: {listed}; {verdict.format(best)}."
    whys = list(dict.fromkeys(why for _, why in judged.values() if why))
    tied = [label for label in values if label == best or judged[label][0] != "differs"]  # in the inputs' order
    if all(judged[label][0] == "same" for label in tied if label != best):
        return (f"{what}: {listed}; {_and(tied)} are the same within {PRACTICAL:.0%} {OF[scale]}"
                + (f" ({'; '.join(whys)})." if whys else "."))
    same = [label for label in tied if label != best and judged[label][0] == "same"]
    within = (f"; {_and(same)} {'is' if len(same) == 1 else 'are'} the same as {best} within {PRACTICAL:.0%} "
              f"{OF[scale]}" if same else "")
    return f"{what}: {listed}; {_and(tied)} are too close to call ({'; '.join(whys)}{within})."


# (tested arm, baseline arm) compared after training, when a run holds both
ARM_PAIRS = (("mixln", "preln"), ("lns", "preln"), ("lns", "mixln"))


def _training_sentences(models: list[Model], numbers: dict[str, ModelNumbers], estimates: dict) -> list[str]:
    trained = [m for m in models if m.arm]
    if not trained:
        return ["No trained arms given (pass a `mixln-convert train` output folder to compare training)."]
    sentences = [_arm_sentence(numbers[m.label]) for m in trained]
    by_arm = {arm: [m for m in trained if m.arm == arm] for arm in ARM_KINDS}
    pairs = []
    for tested, baseline in ARM_PAIRS:
        every = [(m, p) for m in by_arm[tested] for p in by_arm[baseline]]
        # arms of one run share data, order and budget; across runs every pairing is shown
        pairs += [(m, p) for m, p in every if m.source == p.source] or every
    if not pairs:  # every pair of kinds is compared: one kind of arm only
        missing = "Mix-LN" if by_arm["preln"] else "Pre-LN"
        sentences.append(f"No {missing} arm was trained, so there is no winner to name.")
    for m, p in pairs:
        sentences += _pair_sentences(m, p, numbers, estimates)
    return sentences


def _pair_sentences(m: Model, p: Model, numbers: dict[str, ModelNumbers], estimates: dict) -> list[str]:
    """The trained arm ``m`` against the baseline arm ``p``: final validation perplexities, a verdict only where
    the bootstrap interval of the ratio excludes 1, and where each started if they are the arms of one run."""
    tested, base = numbers[m.label], numbers[p.label]
    name, base_name = ARM_KINDS[m.arm], ARM_KINDS[p.arm]
    if tested.final_val_ppl is None or base.final_val_ppl is None:
        return [f"{m.label} and {p.label}: no validation perplexity for both yet, no winner to name."]
    change = tested.final_val_ppl / base.final_val_ppl - 1
    a, b = estimates[m.label].get("final_val_ppl"), estimates[p.label].get("final_val_ppl")
    sentence = (f"Validation perplexity after training: {name} ({m.label}) {tested.final_val_ppl:.2f} vs "
                f"{base_name} ({p.label}) {base.final_val_ppl:.2f} ({_percent(change)}")
    if a is not None and b is not None:
        low, high = uncertainty.interval(a.draws / b.draws - 1)
        sentence += (f", {LEVEL:.0%} bootstrap interval [{_percent(low)}, {_percent(high)}] over the {a.n} "
                     "validation windows")
    outcome, why = judge(RATIO, tested.final_val_ppl, base.final_val_ppl, a, b)
    if outcome == "differs":
        verdict = f"{name if change < 0 else base_name} wins by {_percent(abs(change)).lstrip('+')}"
    elif outcome == "same":
        verdict = f"the same within {PRACTICAL:.0%} {OF[RATIO]}" + (f" ({why})" if why else "")
    elif why.endswith("includes 0"):
        verdict = (f"too close to call: {tested.tokens_trained:,} training tokens per arm and "
                   f"{tested.validation.tokens:,} validation tokens cannot decide between them")
    else:
        verdict = f"too close to call ({why})"
    sentence += f"): {verdict}."
    if tested.tokens_trained != base.tokens_trained:
        sentence += (f" They trained on different token counts ({tested.tokens_trained:,} vs "
                     f"{base.tokens_trained:,}), so this is not like for like.")
    if m.source != p.source or p.arm != "preln" or None in (tested.initial_val_ppl, base.initial_val_ppl):
        return [sentence]
    original, converted = base.initial_val_ppl, tested.initial_val_ppl  # Pre-LN starts from the original
    after = (f"after training {name} is at {tested.final_val_ppl / original:.2f}x the original and Pre-LN at "
             f"{base.final_val_ppl / original:.2f}x.")
    if m.arm == "lns":  # the retrofit is exact: a start away from Pre-LN's says the conversion is not
        return [sentence, f"Before training LNS scored {converted:.2f} and Pre-LN {original:.2f} "
                          f"({converted / original:.4f}x: from a pretrained source the LNS retrofit computes its "
                          f"function, so 1.0000x up to rounding; from scratch they differ); {after}"]
    # with a heal the arm starts from the healed model, so its first figure is the healed one
    heal_tokens = m.summary and m.summary.heal_tokens  # None in summaries written before it was recorded
    healed = f" and a heal on {heal_tokens:,} tokens" if heal_tokens else ""
    return [sentence, f"Conversion{healed} took validation perplexity from {original:.2f} (original) to "
                      f"{converted:.2f} ({converted / original:.2f}x); {after}"]


def _percent(x: float) -> str:
    """``x`` as a signed percentage to a tenth of a percent, or below that to two significant digits:
    two arms of nearly one function (the LNS retrofit and Pre-LN) differ by 0.002%, which is not 0.0%."""
    return f"{x:+.1%}" if x == 0 or abs(x) >= 0.0005 else f"{100 * x:+.2g}%"


def _arm_sentence(arm: ModelNumbers) -> str:
    before = "not recorded" if arm.initial_val_ppl is None else f"{arm.initial_val_ppl:.2f}"
    after = "not measured yet" if arm.final_val_ppl is None else f"{arm.final_val_ppl:.2f}"
    state = "" if arm.finished else " (unfinished: no summary.json yet)"
    where = f" ({measured_on(arm.validation)})" if arm.validation else ""
    return (f"{arm.label}, {arm.layout}{state}: validation perplexity {before} before training, "
            f"{after} after {arm.tokens_trained:,} tokens{where}.")


def _deep_drop_text(f: ModelNumbers, found: Bootstrap | None) -> str:
    text = _with_interval(f"{f.deep_layer_drop:+.3g} ({f.deep_layer_drop_relative:+.1%}", found,
                          lambda x: f"{x:+.1%}")
    text += f"; median {f.deep_layer_drop_median:+.3g}"
    block, share = f.deep_layer_drop_top
    if share is not None and share > 0.5:  # a mean carried by one block says little of the others
        text += f"; block {block} alone gives {share:.0%} of the total"
    return text + ")"


def _analysis_sentences(models: list[Model], numbers: dict[str, ModelNumbers], estimates: dict) -> list[str]:
    analysed = [numbers[m.label] for m in models if m.analysis]
    if not analysed:
        return ["No analysis given, so no layer comparison (pass `mixln-convert analyze` output, or an arm folder "
                "with analysis/analysis.json)."]
    wheres = {measured_on(f.evaluation) for f in analysed}
    sentences = [f"The analyses were measured on {' / '.join(sorted(wheres))}"
                 + (" (not the same windows for every model: compare with care)." if len(wheres) > 1 else ".")]
    layered = [numbers[m.label] for m in models if m.layered]
    if layered:
        sentences += _layer_sentences(layered, estimates)
    else:
        sentences.append(f"No analysis holds the layer sweep (each was made with "
                         f"{AnalyzeOptions.flag('layer_sweep', off=True)}), so no layer comparison.")
    during = [numbers[m.label] for m in models if numbers[m.label].training_grad_norm_cv is not None]
    if during:  # one training step's gradient: no windows to resample
        sentences.append(_ranking("The same at the last logged training step (one minibatch, no interval)",
                                  {f.label: f"{f.training_grad_norm_cv:.3f}" for f in during},
                                  {f.label: f.training_grad_norm_cv for f in during},
                                  "most uniform in {}", False, {}, RELATIVE,
                                  "one minibatch each: no interval to call a difference by"))
    written = [f for f in analysed if f.repeated_4gram_share is not None]
    if written:
        sentences.append("Greedy continuations of the fixed prompts (see What the models write): "
                         + ", ".join(f"{f.label} {f.repeated_4gram_share:.1%}" for f in written)
                         + " of their 4-grams repeat an earlier one (lower is more varied).")
    return sentences + [_pruning_sentence(analysed, {f.label: estimates[f.label].get("prune_ratio")
                                                     for f in analysed})]


def _layer_sentences(layered: list[ModelNumbers], estimates: dict) -> list[str]:
    """The layer sweep's rankings: deep-block removal, angular distance, gradient-norm uniformity."""
    sentences = []
    for what, name, form, verdict, highest, scale in (
            ("Removing one block of the deeper half raises perplexity on average by", "deep_layer_drop_relative",
             None, "relative to each model's perplexity, the deep blocks matter most in {}", True, POINTS),
            ("Mean angular distance between consecutive block inputs in the deeper half", "deep_angular_distance",
             ".4f", "the deep blocks change the representation most in {}", True, RELATIVE),
            ("Coefficient of variation of the gradient norm across blocks (std/mean, lower is more uniform)",
             "grad_norm_cv", ".3f", "most uniform in {}", False, RELATIVE)):
        found = {f.label: estimates[f.label].get(name) for f in layered}
        shown = {f.label: _with_interval(f"{getattr(f, name):{form}}", found[f.label]) if form
                 else _deep_drop_text(f, found[f.label]) for f in layered}
        sentences.append(_ranking(what, shown, {f.label: getattr(f, name) for f in layered}, verdict, highest, found,
                                  scale))
    return sentences


def _pruning_sentence(analysed: list[ModelNumbers], found: dict) -> str:
    curves = [f for f in analysed if f.prune is not None]
    if not curves:
        return f"No pruning curves given (make them with `mixln-convert analyze {AnalyzeOptions.flag('prune_curve')}`)."
    reached = [f for f in curves if f.prune[PRUNE_VERDICT]]
    if not reached:
        return f"The pruning curves do not reach N = {PRUNE_VERDICT} removed blocks, so no pruning comparison."
    ratios = {f.label: f.prune[PRUNE_VERDICT][1] / f.perplexity for f in reached}
    shown = {f.label: _with_interval(f"{ratios[f.label]:.2f}x (N={f.prune[PRUNE_VERDICT][0]})", found.get(f.label),
                                     lambda x: f"{1 + x:.2f}x")  # x: ratio - 1
             for f in reached}
    methods = sorted({f.prune_method for f in curves})
    by = f"chosen by '{methods[0]}'" if len(methods) == 1 else f"chosen by different methods ({', '.join(methods)})"
    return _ranking(f"With N = {PRUNE_VERDICT} blocks removed ({by}), perplexity grows", shown, ratios,
                    "{} keeps the most of its quality", False, found, POINTS)
