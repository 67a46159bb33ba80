"""``analyze()``: per-layer metrics of a checkpoint, written as ``DIR/analysis.json`` and plots, after
the Mix-LN paper's layer analysis (arXiv 2412.13795; docs/mixln.md): perplexity increase when a block
is skipped, angular distance between block inputs (Gromov et al. 2024), block influence (ShortGPT)
and gradient norms per block."""

import dataclasses

import torch

from ..data import read_texts, token_windows
from ..errors import MixLNError
from ..evaluation.generation import greedy_continuations
from ..evaluation.options import EVAL_DATA
from ..evaluation.perplexity import check_finite_score, evaluate_documents, evaluate_perplexity
from ..io.atomic import atomic_output_dir
from ..io.loader import open_checkpoint
from ..io.paths import check_destination, check_readable, checkpoint_path
from ..options import OUT
from ..runtime import map_large_allocations
from ..schema import check_windows
from .choice import choose_layers
from .layers import BlockRunner, RepresentationStatistics, grad_norm_per_layer, removal_sweep
from .options import AnalyzeOptions
from .plots import plot_analysis
from .result import Analysis, PerWindow, PruneCurve


def analyze(ckpt, out, options: AnalyzeOptions | None = None, *, force: bool = False, task_manager=None,
            progress: bool = True, **settings) -> Analysis:
    """Measure ``ckpt`` (HF folder, LLaMA or Mix-LN, or .gguf) on held-out text and write
    ``out/analysis.json`` and PNG plots; returns the analysis.

    ``options``: an :class:`~mixln_convert.analysis.options.AnalyzeOptions`, or its fields as ``settings``.
    ``data`` (default the embedded validation split) is cut into ``max_tokens`` tokens in windows of
    ``seq_len``. Without ``layer_sweep`` the layer sweep and gradient norms (L forwards and a backward)
    are skipped. ``span``: the n of the angular distance between the inputs of blocks l and l+n.
    ``prune_curve``, ``generate``, ``per_document`` and ``tasks`` (lm-eval task names, at most ``limit``
    examples each) add their measurements; ``task_manager``, if given, is the tasks'
    :func:`mixln_convert.evaluation.downstream.known_tasks`.
    """
    map_large_allocations()
    options = AnalyzeOptions.given(options, settings)
    ckpt = checkpoint_path(ckpt, "CKPT")
    inputs = {"CKPT": ckpt, options.flag("data"): options.data, options.flag("include_path"): options.include_path}
    check_readable(options.data, options.flag("data"))
    check_destination(out, inputs, force, flag=OUT)
    if options.tasks and task_manager is None:
        from ..evaluation.downstream import known_tasks

        task_manager = known_tasks(options)
    source = open_checkpoint(ckpt)
    num_layers = source.config["num_hidden_layers"]
    if options.span > num_layers:
        raise MixLNError(f"{options.flag('span')}: {options.span} exceeds the {num_layers} layers of this model")
    check_windows(options, source.config)
    with atomic_output_dir(out, force=force, protect=inputs) as tmp:
        result = measure(source, str(ckpt), options, task_manager, progress)
        result.write(tmp)
        plot_analysis(result, tmp)
    return result


def measure(source, name: str, options: AnalyzeOptions, task_manager, progress: bool) -> Analysis:
    """The analysis of the opened checkpoint ``source`` (``name``: its local path, which analysis.json records)."""
    data, seq_len, batch_size = options.data, options.seq_len, options.batch_size
    tokenizer, num_layers = source.tokenizer, source.config["num_hidden_layers"]
    texts = read_texts(data, split="validation")
    windows = token_windows(tokenizer, texts, seq_len, options.max_tokens, source=data or EVAL_DATA)
    # angles and small perplexity differences need float32; a GPU where there is one (every sweep is L forwards)
    model = source.model(dtype=torch.float32, device="cuda" if torch.cuda.is_available() else "cpu")
    post_ln_layers = getattr(model.config, "post_ln_layers", 0)
    # layernorm_scaling (LNS): every block Pre-LN, its norm outputs scaled by 1/sqrt(l)
    result = Analysis(checkpoint=name, data=str(data) if data else EVAL_DATA, seq_len=seq_len,
                      num_layers=num_layers, post_ln_layers=post_ln_layers,
                      layernorm_scaling=getattr(model.config, "layernorm_scaling", False),
                      layout=["Post-LN" if i < post_ln_layers else "Pre-LN" for i in range(num_layers)],
                      **(layer_metrics(model, windows, options.span, batch_size, progress)
                         if options.layer_sweep else perplexity_only(model, windows, batch_size, progress)),
                      tokenizer_vocab_size=len(tokenizer))
    check_finite_score(result.perplexity, source.path, "perplexity")
    extras = {}
    if options.prune_curve:
        extras.update(prune_curve=pruning_curve(BlockRunner(model), windows, options.method, vars(result), batch_size,
                                                progress))
    if options.generate:
        extras.update(generation=greedy_continuations(model, tokenizer, progress=progress))
    if options.per_document:
        extras.update(per_document=evaluate_documents(model, tokenizer, texts, seq_len, batch_size, options.max_tokens,
                                                      progress))
    if options.tasks:
        from .task_drop import task_layer_drop

        extras.update(task_drop={task: task_layer_drop(model, tokenizer, task, task_manager, limit=options.limit,
                                                       batch_size=batch_size, progress=progress)
                                 for task in options.tasks})
    return dataclasses.replace(result, **extras)


def layer_metrics(model, windows: torch.Tensor, span: int, batch_size: int, progress: bool) -> dict:
    """Perplexity, layer drop, angular distances and block influence (one sweep), and gradient
    norms; with the per-window (and per-batch) values the report bootstraps its intervals from."""
    runner = BlockRunner(model)
    statistics = RepresentationStatistics(runner.num_layers)
    sweep = removal_sweep(runner, windows, [[l] for l in range(runner.num_layers)], batch_size, statistics, progress)
    matrix = statistics.angular_distance_matrix()
    grad_norms = grad_norm_per_layer(model, windows, batch_size)
    return {
        "tokens": sweep.tokens,
        "perplexity": sweep.perplexity,
        "layer_drop": [p - sweep.perplexity for p in sweep.removed],
        # the last span-1 blocks have no boundary span blocks ahead: null
        "angular_distance": [row[span - 1] if len(row) >= span else None for row in matrix],
        "angular_distance_matrix": matrix,
        "span": span,
        "block_influence": statistics.block_influence(),
        "grad_norm_per_layer": [sum(column) / len(grad_norms) for column in zip(*grad_norms)],  # mean over batches
        "per_window": PerWindow(  # evaluation window w (or batch b for gradients) -> one value per layer
            loss=sweep.window_losses,
            loss_without_layer=[list(losses) for losses in zip(*sweep.removed_window_losses)],
            angular_distance=statistics.window_angles, grad_norm_per_layer=grad_norms),
    }


def perplexity_only(model, windows: torch.Tensor, batch_size: int, progress: bool) -> dict:
    """The perplexity, with the per-window losses its interval is bootstrapped from (no layer sweep)."""
    scored = evaluate_perplexity(model, windows, batch_size, progress)
    return dict(tokens=scored.tokens, perplexity=scored.perplexity, per_window=PerWindow(loss=scored.window_losses))


def pruning_curve(runner: BlockRunner, windows: torch.Tensor, method: str, scores: dict, batch_size: int,
                  progress: bool) -> PruneCurve:
    """Perplexity with N = 1..L/2 blocks removed by ``method`` (ranked by ``scores``), in memory."""
    counts = list(range(1, runner.num_layers // 2 + 1))
    removals = [choose_layers(method, n, runner.num_layers, scores) for n in counts]
    sweep = removal_sweep(runner, windows, removals, batch_size, progress=progress, desc=f"prune curve ({method})")
    return PruneCurve(method=method, removed=counts, perplexity=sweep.removed, layers=removals,
                      window_losses=sweep.removed_window_losses)
