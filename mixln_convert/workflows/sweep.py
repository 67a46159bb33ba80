"""``sweep()``: which Post-LN ratio suits this model? Each alpha's calibrated conversion (one calibration
pass serves them all: block i's statistics depend only on blocks before it), an optional heal and short
continued pre-training beside a Pre-LN control trained once per seed on the same data and order (and, if
asked, the LayerNorm Scaling retrofit trained alike), the analysis of each, one report and a recommendation.

Each alpha's outputs appear atomically in ``OUT/post-ln-NN``, so a killed sweep resumes where it stopped.
"""

import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from ..analysis.measures import coefficient_of_variation
from ..conversion.options import CALIBRATION_SEQ_LEN, CALIBRATION_TOKENS
from ..data import data_fingerprint
from ..data.corpus import check_text
from ..data.shards import is_tokens_folder
from ..errors import MixLNError
from ..io.atomic import atomic_output_dir
from ..io.loader import open_checkpoint
from ..io.paths import check_readable, checkpoint_path
from ..io.records import METRICS, read_metrics
from ..options import check_force_or_resume
from ..report.sweep import (AlphaRow, Original, Profile, Recommendation, Scores, SweepResult, TrainedRun,
                            write_sweep_report)
from ..schema import Nested
from ..training import Recipe, load_recipe
from .options import CPU_RECIPE, MAX_GRAD_RATIO, MAX_PPL_INCREASE, SweepOptions
from .runs import STAGE_RESULT, Stages, claim_run, timed

log = logging.getLogger(__name__)  # the sweep's progress: the CLI shows it, a library caller may silence it
FIRST_STEPS = 4  # gradient norms "over the first steps": this many training steps (or analysis batches)


@dataclass(frozen=True)
class Rule:
    """The rule the recommendation follows (stated by :meth:`describe`)."""

    max_ppl_increase: float = MAX_PPL_INCREASE
    max_grad_ratio: float = MAX_GRAD_RATIO

    def describe(self, stage: str) -> str:
        return (f"the largest alpha whose {stage} perplexity is at most {self.max_ppl_increase:.0%} above the "
                f"original's and whose largest Post-LN block gradient norm over the first steps is at most "
                f"{self.max_grad_ratio:g}x the Pre-LN blocks' mean (alpha 0 always passes the gradient test)")

    def failures(self, row: AlphaRow, stage: str, original_ppl: float) -> list[str]:
        """Why ``row`` fails the rule ([] when it passes)."""
        reasons = []
        ratio = getattr(row, stage).perplexity / original_ppl
        if ratio > 1 + self.max_ppl_increase:
            reasons.append(f"{stage} perplexity {ratio:.3f}x the original's")
        if (grad := row.post_pre_grad_ratio) is not None and grad > self.max_grad_ratio:
            reasons.append(f"Post-LN gradient norm {grad:.2f}x the Pre-LN blocks'")
        return reasons


def recommend(rows: list[AlphaRow], original_ppl: float, rule: Rule, stage: str) -> Recommendation:
    """The row ``rule`` recommends (the passing one with the most Post-LN blocks) and, per row, why
    it failed; ``post_ln_layers`` None when no row passes."""
    failures = {row.post_ln_layers: rule.failures(row, stage, original_ppl) for row in rows}
    passing = [row for row in rows if not failures[row.post_ln_layers]]
    best = max(passing, key=lambda row: row.post_ln_layers) if passing else None
    return Recommendation(rule=rule.describe(stage), stage=stage, **asdict(rule),
                          post_ln_layers=best.post_ln_layers if best else None, alphas=best.alphas if best else None,
                          failures={str(n): reasons for n, reasons in failures.items()})


def gradient_figures(steps: list[list[float]], post_ln_layers: int) -> dict:
    """Spread of per-block gradient norms over the first ``steps`` (one list per step): the mean CV, and the
    largest Post-LN block's norm over the Pre-LN blocks' mean (None without both kinds of block)."""
    norms = np.asarray(steps[:FIRST_STEPS], dtype=float)
    cv = float(coefficient_of_variation(norms, axis=1).mean())
    ratio = (float((norms[:, :post_ln_layers].max(axis=1) / norms[:, post_ln_layers:].mean(axis=1)).max())
             if 0 < post_ln_layers < norms.shape[1] else None)
    return {"grad_norm_cv": cv, "post_pre_grad_ratio": ratio, "grad_steps": len(norms)}


def _plan(src: str, options: SweepOptions, resume: bool, force: bool):
    """Every check before any work: (the settings a --resume must find unchanged, the source, {Post-LN
    count: its alphas}, the training recipe)."""
    from ..conversion.layout import post_ln_count
    from .train import check_launch

    check_force_or_resume(force, resume)
    check_launch()
    data = options.data
    check_readable(data, options.flag("data"))
    source = open_checkpoint(src)
    options.check_model(source.config)
    # what every stage's result depends on, which a resume must find unchanged (not the alphas: each block
    # count is a stage of its own, so a resume may add some; not the rule: it only reads the results)
    settings = {"SRC": str(Path(src).absolute()), "SRC's files": source.fingerprint(),
                **options.flagged("heal_tokens", "train_tokens"), options.flag("data"): data_fingerprint(data),
                **options.flagged("seeds", "eval_tokens")}
    if options.lns:  # recorded only when given: a sweep begun before the LNS arm existed still resumes
        settings[options.flag("lns")] = True
    counts: dict[int, list[float]] = {}
    for alpha in options.alphas:  # equal counts run once
        counts.setdefault(post_ln_count(source.config["num_hidden_layers"], alpha, None), []).append(alpha)
    training = _training_recipe(src, data, options.train_tokens)
    if data is not None and not is_tokens_folder(data):  # read by the heal and training only after the original's stage
        check_text(data, options.flag("data"))
    return settings, source, counts, training


def sweep(src, out, options: SweepOptions | None = None, *, resume: bool = False, force: bool = False,
          progress: bool = True, **settings) -> SweepResult:
    """Sweep the Post-LN ratio of ``src`` (HF folder or .gguf) into ``out``; returns the result written to
    ``out/sweep.json`` beside ``out/report``. ``options``: a :class:`~mixln_convert.workflows.options.SweepOptions`, or
    its fields as ``settings``."""
    options = SweepOptions.given(options, settings)
    src = checkpoint_path(src, "SRC")
    settings, source, counts, training = _plan(src, options, resume, force)
    with claim_run(out, "sweep", settings, {"SRC": src, options.flag("data"): options.data}, resume, force) as claim:
        claim.start()
        return _sweep(src, claim.path, options, source, counts, training, resume, progress)


def _sweep(src: str, out: Path, options: SweepOptions, source, counts: dict, training, resume: bool,
           progress: bool) -> SweepResult:
    """The sweep's stages into ``out``, claimed for it; each stage's result (JSON, read back on a resume) typed."""
    data, eval_tokens, num_layers = options.data, options.eval_tokens, source.config["num_hidden_layers"]
    stages = Stages(resume)
    times = {"stages_s": stages.times}
    original = stages.record(Nested(Original, "the original's stage"), "original", out / "original",
                             lambda tmp: Original(_scores(src, eval_tokens, progress),
                                                  _analysis(src, tmp, eval_tokens, progress)))

    def seeded(arm: str, name: str) -> list[TrainedRun]:
        """``arm`` trained once per seed from the source, on the data and order of the alphas' seeds."""
        run = Nested(TrainedRun, "a training run")
        return [stages.record(run, f"{name} (seed {seed})", out / f"{name}-seed{seed}",
                              lambda tmp, recipe=training.replace(options.flag("seeds"), seed=seed):
                              _train(recipe, tmp / "train", arm, progress))
                for seed in range(options.seeds)]

    controls = seeded("preln", "control") if options.train_tokens else []
    lns_runs = seeded("lns", "lns") if options.lns else []

    pending = [n for n in counts if not (resume and (_folder(out, n) / STAGE_RESULT).is_file())]
    stats = _calibrate(source, max(pending), times, progress) if any(n > 0 for n in pending) else None

    rows = []
    for i, (n, given) in enumerate(sorted(counts.items()), 1):
        log.info(f"[alpha {i}/{len(counts)}] alpha {', '.join(f'{a:g}' for a in given)}: {n} of {num_layers} blocks "
                 "Post-LN")
        row = stages.record(Nested(AlphaRow, "a sweep's row"), f"post-ln-{n}", _folder(out, n),
                            lambda tmp, n=n, given=given: _alpha(src, tmp, n, given, stats, options, training,
                                                                 original, controls, progress))
        log.info(f"      converted {row.converted.perplexity:.2f} (original {original.scores.perplexity:.2f})"
                 + (f", healed {row.healed.perplexity:.2f}" if row.healed else ""))
        rows.append(row)

    result = SweepResult(
        source=str(src), num_layers=num_layers, eval_tokens=eval_tokens, heal_tokens=options.heal_tokens,
        train_tokens=options.train_tokens, seeds=options.seeds, data=str(data) if data else None,
        original=original, control=controls, lns=lns_runs, rows=rows,
        recommendation=recommend(rows, original.scores.perplexity, Rule(options.max_ppl_increase,
                                 options.max_grad_ratio), "healed" if options.heal_tokens else "converted"),
        times={**times, **{f"post-ln-{row.post_ln_layers}": row.times for row in rows}})
    with atomic_output_dir(out / "report", force=True) as tmp:
        write_sweep_report(tmp, result)
    result.write(out)
    return result


def _training_recipe(src, data, train_tokens: int):
    """The recipe of every training run of the sweep (arms of each alpha and the controls; each
    run replaces its seed, an alpha's also its converted checkpoint); None without ``train_tokens``."""
    if not train_tokens:
        return None
    defaults = load_recipe(CPU_RECIPE, changes={"source": str(Path(src).absolute()), "grad_norm_interval": 1},
                           changed_by="sweep")
    if data is not None:  # a path (made absolute) or a Hub dataset name, as a recipe takes it
        defaults = defaults.replace("sweep", data=replace(defaults.data, train=str(data)))
    step_tokens = defaults.global_batch_size * defaults.seq_len
    if train_tokens < step_tokens:
        raise MixLNError(f"{SweepOptions.flag('train_tokens')}: {train_tokens} is less than one training step "
                         f"({step_tokens} tokens)")
    # validate at the end only: the report compares final perplexities
    return defaults.replace(SweepOptions.flag("train_tokens"), max_tokens=train_tokens,
                            eval_interval=train_tokens // step_tokens)


def _calibrate(source, post_ln_layers: int, times: dict, progress: bool):
    """The calibration statistics of the first ``post_ln_layers`` blocks, which every alpha's conversion reuses."""
    from ..conversion.converter import calibration_statistics

    log.info(f"calibrating the first {post_ln_layers} blocks once for every alpha")
    with timed(times, "calibration_s"):
        return calibration_statistics(source, source.arch, post_ln_layers, None, CALIBRATION_TOKENS,
                                      CALIBRATION_SEQ_LEN, progress)


def _folder(out: Path, post_ln_layers: int) -> Path:
    return out / f"post-ln-{post_ln_layers:02d}"


def _scores(ckpt, eval_tokens: int, progress: bool) -> Scores:
    from ..evaluation.perplexity import score_checkpoint

    scored = score_checkpoint(ckpt, max_tokens=eval_tokens, per_document=True, progress=progress)
    return Scores(scored.perplexity, scored.per_document.token_perplexity, scored.tokens, scored.seq_len, scored.data)


def _analysis(ckpt, tmp: Path, eval_tokens: int, progress: bool) -> Profile:
    from ..analysis.analyze import analyze

    result = analyze(ckpt, tmp / "analysis", max_tokens=eval_tokens, progress=progress)
    return Profile(result.perplexity, result.layer_drop, result.angular_distance, result.post_ln_layers,
                   result.per_window.grad_norm_per_layer)


def _train(recipe: Recipe, folder: Path, arm: str, progress: bool) -> TrainedRun:
    from .train import train

    summary = train(recipe, folder, arms=(arm,), progress=progress)[arm]
    records = read_metrics(folder / arm / METRICS)
    return TrainedRun(summary.final_val_ppl, summary.initial_val_ppl, summary.tokens, recipe.seed,
                      [r.grad_norm_per_layer for r in records if r.grad_norm_per_layer is not None][:FIRST_STEPS])


def _alpha(src, tmp: Path, post_ln_layers: int, given: list[float], stats, options: SweepOptions, training,
           original: Original, controls: list[TrainedRun], progress: bool) -> AlphaRow:
    """Convert ``src`` with ``post_ln_layers`` Post-LN blocks into ``tmp/converted`` (reusing ``stats``), heal,
    train each seed, score every stage and analyze the last one."""
    from ..conversion.converter import convert
    from ..healing import heal

    heal_tokens, eval_tokens = options.heal_tokens, options.eval_tokens
    times, healed, trained = {}, None, None
    if post_ln_layers == 0:  # no Post-LN block: the original's weights, measured once as "original" and the control
        converted, analysis, trained = original.scores, original.analysis, controls or None
        healed = converted if heal_tokens else None
    else:
        with timed(times, "convert_s"):
            stage = convert(src, tmp / "converted", post_ln_layers=post_ln_layers, statistics=stats, progress=progress)
        converted = _scores(stage, eval_tokens, progress)
        if heal_tokens:
            stage = tmp / "healed"
            with timed(times, "heal_s"):
                heal(tmp / "converted", src, stage, data=options.data, perplexity=False, progress=progress,
                     named=None, checked=True, **asdict(options.heal))
                healed = _scores(stage, eval_tokens, progress)
        final = stage
        if options.train_tokens:
            with timed(times, "train_s"):
                trained = [_train(training.replace("sweep", converted=str(stage.absolute()), seed=seed),
                                  tmp / f"train-seed{seed}", "mixln", progress) for seed in range(options.seeds)]
            final = tmp / "train-seed0" / "mixln" / "final"
        with timed(times, "analysis_s"):
            analysis = _analysis(final, tmp, eval_tokens, progress)
    return AlphaRow(post_ln_layers=post_ln_layers, alphas=given, converted=converted, healed=healed, trained=trained,
                    analysis=analysis, times=times, gradients_from="training steps" if trained else "analysis batches",
                    **gradient_figures(trained[0].grad_norm_steps if trained else analysis.grad_norm_batches,
                                       post_ln_layers))
