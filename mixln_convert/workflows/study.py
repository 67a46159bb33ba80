"""``study()``: the Mix-LN paper's from-scratch comparison, run through the engine.

For each initialization scheme (scaled init on, off) and seed, a Pre-LN, a Mix-LN and a Post-LN arm (and, if
asked, a LayerNorm Scaling one: its successor, arXiv 2502.05795) are trained with ``conversion.strategy:
scratch``: every arm is initialized by the same seeded plan, so tensors the layouts share start equal, and all
arms of a seed read the same tokens in the same order. Each final model is analyzed; the Mix-LN paper's three
claims and the LNS paper's two then each get a verdict per scheme, decided against the spread between seeds.

Layout of ``out``: ``<scheme>/seed-<s>/<arm>/`` is one training run folder (``train --out``) with the arm's
analysis in ``analysis/``; ``study.json`` and ``report/`` at the top. ``resume`` keeps finished runs and
resumes interrupted ones from their last checkpoint.
"""

import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ..analysis.measures import coefficient_of_variation, deep_half, verdict
from ..analysis.result import Analysis
from ..data.corpus import check_text
from ..data.shards import is_tokens_folder
from ..io.paths import checkpoint_path
from ..io.records import METRICS, read_metrics
from ..report.study import CLAIMS, LNS_CLAIMS, SCALED_INIT, StudyResult, StudyRow, write_study_report
from ..schema import Nested
from ..training.recipe import Conversion, Recipe
from ..training.summary import TrainSummary
from .options import STUDY_SCHEMES, StudyOptions
from .runs import Stages, claim_run

LNS_ARM = "LNS"


@dataclass(frozen=True)
class StudyRun:
    """One planned run of a study: an arm of one scheme and seed, trained by ``recipe`` into ``folder``."""

    scheme: str
    seed: int
    arm: str  # the study's name of the arm, e.g. "Mix-LN (alpha 0.25)"
    engine_arm: str  # the train command's arm: mixln (Mix-LN and Post-LN), preln or lns
    folder: Path  # <study>/<scheme>/seed-<seed>/<arm slug>
    recipe: Recipe

    @property
    def name(self) -> str:
        return "/".join(self.folder.parts[-3:])


def arms_for(alpha: float, post_ln: bool, lns: bool = False) -> dict:
    """Study arm -> (engine arm, conversion alpha)."""
    arms = {"Pre-LN": ("preln", 0.0), f"Mix-LN (alpha {alpha:g})": ("mixln", alpha)}
    if post_ln:
        arms["Post-LN"] = ("mixln", 1.0)
    if lns:  # every block Pre-LN: the alpha is not read
        arms[LNS_ARM] = ("lns", 0.0)
    return arms


def study(source, out, options: StudyOptions | None = None, *, resume: bool = False, progress: bool = True,
          **settings) -> StudyResult:
    """Train and analyze every (scheme, seed, arm) into ``out``; returns the study (``study.json``).

    ``options``: a :class:`~mixln_convert.workflows.options.StudyOptions`, or its fields as ``settings``. ``source``
    gives the model's shape and tokenizer; its weights are not used."""
    from ..io.loader import open_checkpoint
    from ..training import load_recipe
    from .train import check_launch

    options = StudyOptions.given(options, settings)
    check_launch()
    source = checkpoint_path(source, "SRC")
    out = Path(out).absolute()
    plans = [  # every run's recipe first: a bad override is refused before any training
        StudyRun(scheme, seed, name, engine_arm, out / scheme / f"seed-{seed}" / _slug(name),
                 load_recipe(options.recipe, options.overrides, changed_by="study", changes={
                     "source": str(source), "seed": seed,
                     "conversion": Conversion(arm_alpha, "scratch", STUDY_SCHEMES[scheme])}))
        for scheme in options.schemes for seed in range(options.seeds)
        for name, (engine_arm, arm_alpha) in arms_for(options.alpha, options.post_ln, options.lns).items()]
    data = plans[0].recipe.data
    for key, text in (("train", data.train), ("validation", data.validation)):  # the runs read it at their turn only
        if text is not None and not is_tokens_folder(text):
            check_text(text, f"data.{key}")
    settings = {"SRC": str(Path(source).absolute()), "SRC's files": open_checkpoint(source).fingerprint(),
                "--recipe and --set": plans[0].recipe.to_dict(), **options.flagged("alpha", "seeds"),
                options.flag("schemes"): list(options.schemes), **options.flagged("post_ln", "eval_tokens")}
    if options.lns:  # recorded only when given: a study begun before the LNS arm existed still resumes
        settings[options.flag("lns")] = True
    with claim_run(out, "study", settings, {"SRC": source}, resume, force_hint=False) as claim:
        claim.start()
        return _study(claim.path, plans, options, source, resume, progress)


def _study(out: Path, plans: list, options, source, resume: bool, progress: bool) -> StudyResult:
    """The study's runs into ``out``, claimed for it, and its report; each run's result (JSON, read back on a
    resume) typed."""
    data = plans[0].recipe.data
    started, stages = time.time(), Stages(resume)
    runs = [stages.record(Nested(StudyRow, "a study's run"), plan.name, plan.folder, lambda folder, plan=plan: _run(
        plan, stages, options.eval_tokens, progress), atomic=False) for plan in plans]
    result = StudyResult(
        source=str(source), recipe=options.recipe, overrides=list(options.overrides), alpha=options.alpha,
        seeds=options.seeds,
        train_data=data.train or "the embedded corpus's train split",
        validation_data=data.validation or (f"a held-out {data.validation_fraction:.0%} of data.train's documents"
                                            if data.train else "the embedded validation split"),
        analysis_data=analysis_text(plans[0].recipe) or "the embedded validation split",
        schemes=list(options.schemes), arms=list(arms_for(options.alpha, options.post_ln, options.lns)),
        eval_tokens=options.eval_tokens,
        runs=runs, wall_time_s=round(time.time() - started, 1), times_s=stages.times, verdicts={})
    # the verdicts are judged on the runs the result holds
    result = replace(result, verdicts=verdicts(result), lns_verdicts=lns_verdicts(result) if options.lns else None)
    result.write(out)
    (out / "report").mkdir(exist_ok=True)
    write_study_report(out / "report", result)
    return result


def _run(plan: StudyRun, stages: Stages, eval_tokens: int, progress: bool) -> StudyRow:
    """One planned run trained and analyzed (what an interrupted one finished is kept), and its figures."""
    from ..analysis.analyze import analyze
    from .train import train

    summary = train(plan.recipe, plan.folder, arms=(plan.engine_arm,), resume=True, progress=progress)[plan.engine_arm]
    final = plan.folder / plan.engine_arm / "final"
    analysis = stages.record(Nested(Analysis, Analysis.WHAT), f"{plan.name} analysis", plan.folder / "analysis",
                             lambda tmp: analyze(final, tmp, data=analysis_text(plan.recipe), max_tokens=eval_tokens,
                                                 seq_len=plan.recipe.seq_len, force=True, progress=progress))
    return StudyRow(scheme=plan.scheme, seed=plan.seed, arm=plan.arm, folder=str(plan.folder),
                    **measure(plan.folder / plan.engine_arm, summary, analysis))


def analysis_text(recipe):
    """The text the analyses score: the recipe's ``data.validation`` when it is text, else (None,
    or a tokenized folder, which holds token ids, not documents) the embedded validation split."""
    validation = recipe.data.validation
    return None if validation is None or is_tokens_folder(validation) else validation


def _slug(arm: str) -> str:
    return arm.split(" ")[0].lower().replace("-", "")


def measure(arm_dir: Path, summary: TrainSummary, analysis: Analysis) -> dict:
    """The figures the claims are judged on (:data:`CLAIMS`), with the curves and profiles they summarize."""
    curve = [(r.tokens, r.val_ppl) for r in read_metrics(arm_dir / METRICS) if r.val_ppl is not None]
    drop = [d / analysis.perplexity for d in analysis.layer_drop]
    grads = analysis.grad_norm_per_layer
    return {
        "final_val_ppl": summary.final_val_ppl, "tokens": summary.tokens,
        "wall_time_s": summary.wall_time_s, "validation_curve": curve,
        # how much the last evaluation interval still moved the curve: ~0 once it has flattened
        "last_interval_change": (curve[-1][1] / curve[-2][1] - 1) if len(curve) >= 2 else None,
        "relative_layer_drop": drop, "deep_layer_drop": statistics.mean(drop[deep_half(len(drop))]),
        "grad_norm_per_layer": grads, "grad_norm_cv": float(coefficient_of_variation(grads)),
    }


def _values(result: StudyResult, scheme: str, arm: str, figure: str) -> list[float]:
    return [getattr(r, figure) for r in result.runs if r.scheme == scheme and r.arm == arm]


def _claims(result: StudyResult, tested: str, claims) -> dict:
    """{scheme: {claim: verdict}} for the arm ``tested`` against Pre-LN, on ``claims`` (of CLAIMS)."""
    pre_arm = result.arms[0]
    return {scheme: {claim: verdict(_values(result, scheme, tested, CLAIMS[claim][0]),
                                    _values(result, scheme, pre_arm, CLAIMS[claim][0]), CLAIMS[claim][1])
                     for claim in claims} for scheme in result.schemes}


def verdicts(result: StudyResult) -> dict:
    """{scheme: {claim: verdict}} for Mix-LN against Pre-LN, and {"scaled init helps Pre-LN": ...}
    for Pre-LN, Mix-LN and an LNS arm when both schemes ran (its perplexity, scaled against plain)."""
    pre_arm, mix_arm = result.arms[:2]
    found = _claims(result, mix_arm, CLAIMS)
    if set(STUDY_SCHEMES) <= set(result.schemes):
        for arm in (pre_arm, mix_arm, *(a for a in result.arms if a == LNS_ARM)):
            found[f"{SCALED_INIT} {arm.split(' ')[0]}"] = verdict(
                _values(result, "scaled", arm, "final_val_ppl"), _values(result, "plain", arm, "final_val_ppl"),
                "lower")
    return found


def lns_verdicts(result: StudyResult) -> dict:
    """{scheme: {claim: verdict}} for the LNS arm against Pre-LN, on the LNS paper's claims."""
    return _claims(result, LNS_ARM, LNS_CLAIMS)
