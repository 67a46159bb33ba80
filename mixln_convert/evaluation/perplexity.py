"""Perplexity on held-out text: packed windows (``evaluate_perplexity``, what training validates
with) and each document on its own from its first token (``evaluate_documents``, how
lm-evaluation-harness scores perplexity tasks); ``score_checkpoint`` runs both (or lm-eval tasks)."""

import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..errors import MixLNError
from ..io.paths import check_readable, checkpoint_path
from ..runtime import map_large_allocations
from ..schema import check_windows
from .generation import greedy_continuations
from .options import EVAL_DATA, EvalOptions
from .result import DocumentScores, PerplexityScores, TaskScores


def window_nll(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Summed next-token negative log-likelihood of each row of ``input_ids`` ([batch]; every
    position but the first is predicted), from the ``logits`` of all its positions."""
    predicted = logits[:, :-1].float()  # the last position predicts nothing scored
    nll = F.cross_entropy(predicted.flatten(0, 1), input_ids[:, 1:].flatten(), reduction="none")
    return nll.view(len(input_ids), -1).sum(-1)


@dataclass(frozen=True)
class Packed:
    """``loss`` in nats; ``window_losses``, each window's mean NLL, are what the report bootstraps intervals from."""
    perplexity: float
    loss: float
    tokens: int
    window_losses: list[float]


@torch.no_grad()
def evaluate_perplexity(model, windows: torch.Tensor, batch_size: int = 4, progress: bool = True) -> Packed:
    """Token-level perplexity of ``model`` on ``windows`` ([n, seq_len] token ids), every position but
    the first predicted."""
    device = next(model.parameters()).device
    window_sums = []
    for start in tqdm(range(0, len(windows), batch_size), desc="evaluating", disable=not progress, leave=False):
        batch = windows[start:start + batch_size].to(device)
        window_sums += window_nll(model(input_ids=batch, use_cache=False).logits, batch).tolist()
    scored = windows.shape[1] - 1
    loss = sum(window_sums) / (len(window_sums) * scored)
    return Packed(math.exp(loss), loss, len(window_sums) * scored, [s / scored for s in window_sums])


@torch.no_grad()
def evaluate_documents(model, tokenizer, texts: list[str], max_length: int, batch_size: int = 4,
                       max_tokens: int | None = None, progress: bool = True) -> DocumentScores:
    """Each document scored on its own from its first token, as lm-evaluation-harness's
    ``loglikelihood_rolling`` does: the first token is predicted from the BOS token (EOS where
    there is none), and a document longer than ``max_length`` in windows that predict every token
    once with up to ``max_length`` tokens of context. Documents are taken in order until
    ``max_tokens`` tokens are scored; the document that reaches it is cut there (one huge
    document must not cost more than the budget). ``loss`` is in nats per token."""
    device = next(model.parameters()).device
    prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    windows, documents, tokens, words, size = [], 0, 0, 0, 0
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            continue
        if max_tokens is not None and tokens + len(ids) > max_tokens:
            ids = ids[:max_tokens - tokens]
            text = tokenizer.decode(ids)  # words and bytes of the part scored
        full = [prefix, *ids]  # full[i] predicts ids[i]
        for done in range(0, len(ids), max_length):
            end = min(done + max_length, len(ids))
            start = max(0, end - max_length)  # as much context as the window holds
            windows.append((full[start:end], ids[start:end], done - start))  # inputs, targets, first scored
        documents, tokens = documents + 1, tokens + len(ids)
        words, size = words + len(re.split(r"\s+", text.strip())), size + len(text.encode("utf-8"))
        if max_tokens is not None and tokens >= max_tokens:
            break
    total = 0.0
    for first in tqdm(range(0, len(windows), batch_size), desc="scoring documents", disable=not progress, leave=False):
        batch = windows[first:first + batch_size]
        width = max(len(inputs) for inputs, _, _ in batch)
        # right padding: with causal attention, padding after a window changes none of its positions
        inputs = torch.full((len(batch), width), prefix, dtype=torch.long)
        targets = torch.full((len(batch), width), -100, dtype=torch.long)
        for row, (window, target, scored_from) in enumerate(batch):
            inputs[row, :len(window)] = torch.tensor(window)
            targets[row, scored_from:len(target)] = torch.tensor(target[scored_from:])
        logits = model(input_ids=inputs.to(device), use_cache=False).logits.float()
        total += F.cross_entropy(logits.flatten(0, 1), targets.to(device).flatten(), reduction="sum").item()
    if tokens == 0:
        raise MixLNError("the documents give no tokens to score")
    return DocumentScores(documents=documents, tokens=tokens, words=words, bytes=size, loss=total / tokens,
                          token_perplexity=math.exp(total / tokens), word_perplexity=math.exp(total / words),
                          byte_perplexity=math.exp(total / size), bits_per_byte=total / size / math.log(2))


def check_finite_score(value: float, checkpoint, what: str) -> None:
    """A NaN or infinite perplexity is no figure to print with exit 0: refuse it, naming the checkpoint."""
    if not math.isfinite(value):
        raise MixLNError(f"{checkpoint}: its {what} is {value}: the model's outputs are not finite on this text "
                         "(a weight too large for float32 arithmetic, or a config value out of range)")


@dataclass
class Scoring:
    """What `eval` will score, read and checked before any model runs (or any task)."""

    source: object  # an open :class:`~mixln_convert.io.loader.Checkpoint`
    options: EvalOptions
    texts: list[str] | None  # None: tasks without per_document
    windows: object | None  # [n, seq_len] token ids, None when not packed (with tasks)


def prepare_scoring(ckpt, options: EvalOptions | None = None, **settings) -> Scoring:
    """Open ``ckpt`` (a path or an open Checkpoint), check ``seq_len`` against it and read the
    held-out text ``data`` (default: the embedded validation split): every refusal comes here.
    ``options``: an :class:`~mixln_convert.evaluation.options.EvalOptions`, or its fields as ``settings``."""
    from ..data import read_texts, token_windows
    from ..io.loader import open_checkpoint

    options = EvalOptions.given(options, settings)
    ckpt = checkpoint_path(ckpt, "CKPT")
    check_readable(options.data, options.flag("data"))
    source = open_checkpoint(ckpt)
    packed = not options.tasks
    if not (packed or options.per_document):  # tasks without --per-document: no text, no windows
        return Scoring(source, options, None, None)
    check_windows(options, source.config)
    texts = read_texts(options.data, split="validation")
    windows = token_windows(source.tokenizer, texts, options.seq_len, options.max_tokens,
                            source=options.data or EVAL_DATA) if packed else None
    return Scoring(source, options, texts, windows)


def score_checkpoint(ckpt, options: EvalOptions | None = None, *, task_manager=None, progress: bool = True,
                     **settings) -> PerplexityScores | TaskScores:
    """What ``mixln-convert eval`` prints: the prepared text (:func:`prepare_scoring`) scored in packed windows, or
    with ``tasks`` lm-evaluation-harness tasks instead (known, and the text read, before the model loads); with
    ``per_document`` each document on its own as well, with ``generate`` greedy continuations of fixed prompts.
    ``task_manager``, if given, is the :func:`~.downstream.known_tasks` of the options'."""
    map_large_allocations()
    options = EvalOptions.given(options, settings)
    if options.tasks:
        from .downstream import evaluate_tasks, known_tasks

        task_manager = task_manager or known_tasks(options)
    scoring = prepare_scoring(ckpt, options)
    source, model = scoring.source, scoring.source.model()  # with tasks, one load for them and the scoring both
    if options.tasks:
        figures = {"batch_size": options.batch_size, **evaluate_tasks(
            model, source.tokenizer, list(options.tasks), task_manager, limit=options.limit,
            batch_size=options.batch_size)}
    else:
        packed = evaluate_perplexity(model, scoring.windows, options.batch_size, progress)
        check_finite_score(packed.perplexity, source.path, "perplexity")
        figures = {"data": str(options.data) if options.data else EVAL_DATA, "seq_len": options.seq_len,
                   **vars(packed)}
    per_document = generation = None
    if options.per_document:
        per_document = evaluate_documents(model, source.tokenizer, scoring.texts, options.seq_len, options.batch_size,
                                          options.max_tokens, progress)
        check_finite_score(per_document.token_perplexity, source.path, "per-document perplexity")
    if options.generate:
        generation = greedy_continuations(model, source.tokenizer, progress=progress)
    return (TaskScores if options.tasks else PerplexityScores)(checkpoint=str(source.path), **figures,
                                                               per_document=per_document, generation=generation)
