"""``compare()``: the numbers that put models side by side, and a plain-language summary made from them.

Per model (:func:`model_numbers`): validation perplexity before and after training, what
removing one block of the deeper half costs, the angular distance the deeper blocks make,
how uniform gradient norms are across blocks, and perplexity under pruning. The Mix-LN paper
(arXiv 2412.13795) expects Mix-LN's deep blocks to matter more and its gradients to be more
uniform than Pre-LN's; the summary says whether these models show it.
"""

import json

import numpy as np

from ..errors import MixLNError
from .downstream import downstream_numbers
from .inputs import PRUNE_FRACTIONS, Model, load_inputs

TIE = 0.005  # relative differences below 0.5% are called ties (a judgement: 10^4-10^5 eval tokens rarely resolve less)
PRUNE_VERDICT = "L/4"  # the pruning sentence compares models at this many removed blocks


def compare(inputs, out, *, labels=(), allow_mismatch: bool = False, force: bool = False) -> dict:
    """Write a report comparing ``inputs`` (analysis folders or files, train output folders) into
    ``out``: report.md, report.html (figures embedded), the PNGs and comparison.json.

    Refuses analyses made with different tokenizers (their perplexities are not comparable)
    unless ``allow_mismatch``; returns {"summary": sentences, "notes": warnings, "models": numbers}.
    """
    from ..io.writer import atomic_output_dir
    from .downstream import beside_layer_drop, plot_task_drops
    from .plots import plot_report
    from .render import write_report

    models = load_inputs(inputs, labels)
    notes = check_tokenizers(models, allow_mismatch)
    numbers = {m.label: model_numbers(m) for m in models}
    result = {"summary": summary_sentences(models, numbers), "notes": notes, "models": list(numbers.values())}
    with atomic_output_dir(out, force=force, protect={f"#{i + 1}": path for i, path in enumerate(inputs)}) as tmp:
        images = beside_layer_drop(plot_report(models, tmp), plot_task_drops(models, tmp))
        write_report(tmp, models, numbers, result["summary"], notes, images)
        (tmp / "comparison.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def check_tokenizers(models: list[Model], allow_mismatch: bool) -> list[str]:
    """[] when every analysis used one tokenizer (by vocabulary size); else a warning with
    ``allow_mismatch``, an error without."""
    sizes = {m.label: m.analysis["tokenizer_vocab_size"] for m in models
             if m.analysis and m.analysis.get("tokenizer_vocab_size") is not None}
    if len(set(sizes.values())) < 2:
        return []
    listed = ", ".join(f"{label} {size}" for label, size in sizes.items())
    message = f"the analyses used different tokenizers (vocabulary sizes {listed}): perplexities are not comparable"
    if not allow_mismatch:
        raise MixLNError(f"inputs: {message}; pass --allow-mismatch to compare anyway")
    return [message]


def coefficient_of_variation(values) -> float:
    """std / mean: 0 when every block gets the same gradient norm."""
    values = np.asarray(values, dtype=float)
    return float(values.std() / values.mean())


def prune_points(analysis: dict) -> dict:
    """{'L/8': (N, perplexity with N blocks removed) or None, ...} from the analysis's prune curve."""
    curve, num_layers = analysis["prune_curve"], analysis["num_layers"]
    measured = dict(zip(curve["removed"], curve["perplexity"]))
    return {name: (n, measured[n]) if (n := num_layers // d) in measured else None
            for name, d in PRUNE_FRACTIONS.items()}


def model_numbers(model: Model) -> dict:
    """The numbers of ``model`` the report compares (None where the input does not have them)."""
    numbers = {"label": model.label, "kind": model.kind, "layout": model.layout, "source": str(model.source)}
    if model.arm:
        numbers.update(arm=model.arm, tokens_trained=model.tokens_trained(),
                       initial_val_ppl=model.val_ppl("initial"), final_val_ppl=model.val_ppl("final"),
                       wall_time_s=model.summary.get("wall_time_s"), finished=bool(model.summary))
        if (norms := model.training_grad_norms()) is not None:
            numbers["training_grad_norm_cv"] = coefficient_of_variation(norms)
    if analysis := model.analysis:
        deep = slice(analysis["num_layers"] // 2, None)  # the deeper half of the blocks
        drop = float(np.mean(analysis["layer_drop"][deep]))
        numbers.update(
            perplexity=analysis["perplexity"],
            deep_layer_drop=drop,
            deep_layer_drop_relative=drop / analysis["perplexity"],
            # span 1 (consecutive block inputs) whatever --span the analysis was made with
            deep_angular_distance=float(np.mean([row[0] for row in analysis["angular_distance_matrix"][deep]])),
            grad_norm_cv=coefficient_of_variation(analysis["grad_norm_per_layer"]),
        )
        if "prune_curve" in analysis:
            numbers["prune_method"] = analysis["prune_curve"]["method"]
            numbers["prune"] = prune_points(analysis)
    numbers.update(downstream_numbers(model))
    return numbers


def summary_sentences(models: list[Model], numbers: dict) -> list[str]:
    """The plain-language summary: training outcome, then the layer analyses."""
    return _training_sentences(models, numbers) + _analysis_sentences(models, numbers)


def _tied(a: float, b: float) -> bool:
    return abs(a - b) <= TIE * max(abs(a), abs(b))


def _ranking(what: str, shown: dict, values: dict, verdict: str, highest: bool) -> str:
    """'<what>: A 1.0, B 2.0; <verdict naming the best>.', where the best has the highest (or
    lowest) of ``values``; a tie when the runner-up is within TIE."""
    listed = ", ".join(f"{label} {text}" for label, text in shown.items())
    if len(values) < 2:
        return f"{what}: {listed} (only one model to show)."
    best = max(values, key=values.get) if highest else min(values, key=values.get)
    tied = [label for label in values if _tied(values[label], values[best])]
    if len(tied) > 1:
        return f"{what}: {listed}; {', '.join(tied[:-1])} and {tied[-1]} are tied (within {TIE:.1%})."
    return f"{what}: {listed}; {verdict.format(best)}."


def _training_sentences(models: list[Model], numbers: dict) -> list[str]:
    trained = [m for m in models if m.arm]
    if not trained:
        return ["No trained arms given (pass a `mixln-convert train` output folder to compare training)."]
    sentences = [_arm_sentence(numbers[m.label]) for m in trained]
    mixln, preln = ([m for m in trained if m.arm == arm] for arm in ("mixln", "preln"))
    # arms of one run share data, order and budget; across runs every pairing is shown
    pairs = [(m, p) for m in mixln for p in preln if m.source == p.source] or [(m, p) for m in mixln for p in preln]
    if not pairs:
        missing = "Pre-LN" if mixln else "Mix-LN"
        sentences.append(f"No {missing} arm was trained, so there is no winner to name.")
    for m, p in pairs:
        mix, pre = numbers[m.label], numbers[p.label]
        if mix["final_val_ppl"] is None or pre["final_val_ppl"] is None:
            sentences.append(f"{m.label} and {p.label}: no validation perplexity for both yet, no winner to name.")
            continue
        change = mix["final_val_ppl"] / pre["final_val_ppl"] - 1
        verdict = (f"a tie (within {TIE:.1%})" if abs(change) < TIE else
                   f"Mix-LN wins by {-change:.1%}" if change < 0 else f"Pre-LN wins by {change:.1%}")
        sentence = (f"Validation perplexity after training: Mix-LN ({m.label}) {mix['final_val_ppl']:.2f} vs "
                    f"Pre-LN ({p.label}) {pre['final_val_ppl']:.2f} ({change:+.1%}): {verdict}.")
        if mix["tokens_trained"] != pre["tokens_trained"]:
            sentence += (f" They trained on different token counts ({mix['tokens_trained']:,} vs "
                         f"{pre['tokens_trained']:,}), so this is not like for like.")
        sentences.append(sentence)
        if m.source == p.source and None not in (mix["initial_val_ppl"], pre["initial_val_ppl"]):
            original, converted = pre["initial_val_ppl"], mix["initial_val_ppl"]  # Pre-LN starts from the original
            sentences.append(
                f"Conversion took validation perplexity from {original:.2f} (original) to {converted:.2f} "
                f"({converted / original:.2f}x); after training Mix-LN is at {mix['final_val_ppl'] / original:.2f}x "
                f"the original and Pre-LN at {pre['final_val_ppl'] / original:.2f}x.")
    return sentences


def _arm_sentence(arm: dict) -> str:
    before = "not recorded" if arm["initial_val_ppl"] is None else f"{arm['initial_val_ppl']:.2f}"
    after = "not measured yet" if arm["final_val_ppl"] is None else f"{arm['final_val_ppl']:.2f}"
    state = "" if arm["finished"] else " (unfinished: no summary.json yet)"
    return (f"{arm['label']}, {arm['layout']}{state}: validation perplexity {before} before training, "
            f"{after} after {arm['tokens_trained']:,} tokens.")


def _analysis_sentences(models: list[Model], numbers: dict) -> list[str]:
    analysed = [numbers[m.label] for m in models if m.analysis]
    if not analysed:
        return ["No analysis given, so no layer comparison (pass `mixln-convert analyze` output, or an arm folder "
                "with analysis/analysis.json)."]
    sentences = [
        _ranking("Removing one block of the deeper half raises perplexity on average by",
                 {f["label"]: f"{f['deep_layer_drop']:+.3g} ({f['deep_layer_drop_relative']:+.1%})" for f in analysed},
                 {f["label"]: f["deep_layer_drop_relative"] for f in analysed},
                 "relative to each model's perplexity, the deep blocks matter most in {}", highest=True),
        _ranking("Mean angular distance between consecutive block inputs in the deeper half",
                 {f["label"]: f"{f['deep_angular_distance']:.3f}" for f in analysed},
                 {f["label"]: f["deep_angular_distance"] for f in analysed},
                 "the deep blocks change the representation most in {}", highest=True),
        _ranking("Coefficient of variation of the gradient norm across blocks (std/mean, lower is more uniform)",
                 {f["label"]: f"{f['grad_norm_cv']:.2f}" for f in analysed},
                 {f["label"]: f["grad_norm_cv"] for f in analysed},
                 "most uniform in {}", highest=False),
    ]
    during = [numbers[m.label] for m in models if "training_grad_norm_cv" in numbers[m.label]]
    if during:
        sentences.append(_ranking("The same at the last logged training step",
                                  {f["label"]: f"{f['training_grad_norm_cv']:.2f}" for f in during},
                                  {f["label"]: f["training_grad_norm_cv"] for f in during},
                                  "most uniform in {}", highest=False))
    return sentences + [_pruning_sentence(analysed)]


def _pruning_sentence(analysed: list[dict]) -> str:
    curves = [f for f in analysed if "prune" in f]
    if not curves:
        return "No pruning curves given (make them with `mixln-convert analyze --prune-curve`)."
    reached = [f for f in curves if f["prune"][PRUNE_VERDICT]]
    if not reached:
        return f"The pruning curves do not reach N = {PRUNE_VERDICT} removed blocks, so no pruning comparison."
    ratios = {f["label"]: f["prune"][PRUNE_VERDICT][1] / f["perplexity"] for f in reached}
    shown = {f["label"]: f"{ratios[f['label']]:.2f}x (N={f['prune'][PRUNE_VERDICT][0]})" for f in reached}
    methods = sorted({f["prune_method"] for f in curves})
    by = f"chosen by '{methods[0]}'" if len(methods) == 1 else f"chosen by different methods ({', '.join(methods)})"
    return _ranking(f"With N = {PRUNE_VERDICT} blocks removed ({by}), perplexity grows", shown, ratios,
                    "{} keeps the most of its quality", highest=False)
