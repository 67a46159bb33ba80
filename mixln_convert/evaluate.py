"""Perplexity on held-out text: packed blocks (``evaluate_perplexity``, what training validates
with) and each document on its own from its first token (``evaluate_documents``, how
lm-evaluation-harness scores perplexity tasks); ``score_checkpoint`` runs both on a checkpoint
with the evaluation definition of :mod:`.options` (``prepare_scoring`` checks and reads, then
``run_scoring`` scores)."""

import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .errors import MixLNError
from .limits import check_batch_size, check_seq_len, check_tokens
from .options import BATCH_SIZE, EVAL_DATA, EVAL_SEQ_LEN, EVAL_TOKENS


def block_nll(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Summed next-token negative log-likelihood of each row of ``input_ids`` ([batch]; every
    position but the first is predicted), from the ``logits`` of all its positions."""
    predicted = logits[:, :-1].float()  # the last position predicts nothing scored
    nll = F.cross_entropy(predicted.flatten(0, 1), input_ids[:, 1:].flatten(), reduction="none")
    return nll.view(len(input_ids), -1).sum(-1)


@torch.no_grad()
def evaluate_perplexity(model, blocks: torch.Tensor, batch_size: int = 4, progress: bool = True) -> dict:
    """Token-level perplexity of ``model`` on ``blocks`` ([n, seq_len] token ids).

    Every position but the first of each block is predicted; returns ``perplexity``,
    ``loss`` (mean negative log-likelihood, nats), ``tokens`` (positions scored) and
    ``block_losses`` (the mean NLL of each block, from which the report bootstraps intervals).
    """
    device = next(model.parameters()).device
    block_sums = []
    for start in tqdm(range(0, len(blocks), batch_size), desc="evaluating", disable=not progress, leave=False):
        batch = blocks[start:start + batch_size].to(device)
        block_sums += block_nll(model(input_ids=batch, use_cache=False).logits, batch).tolist()
    scored = blocks.shape[1] - 1
    loss = sum(block_sums) / (len(block_sums) * scored)
    return {"perplexity": math.exp(loss), "loss": loss, "tokens": len(block_sums) * scored,
            "block_losses": [s / scored for s in block_sums]}


@torch.no_grad()
def evaluate_documents(model, tokenizer, texts: list[str], max_length: int, batch_size: int = 4,
                       max_tokens: int | None = None, progress: bool = True) -> dict:
    """Each document scored on its own from its first token, as lm-evaluation-harness's
    ``loglikelihood_rolling`` does: the first token is predicted from the BOS token (EOS where
    there is none), and a document longer than ``max_length`` in windows that predict every token
    once with up to ``max_length`` tokens of context. Documents are taken in order until
    ``max_tokens`` tokens are scored; the document that reaches it is cut there (one huge
    document must not cost more than the budget). Returns ``documents``, ``tokens``, ``words``, ``bytes``,
    ``loss`` (nats per token), ``token_perplexity``, ``word_perplexity``, ``byte_perplexity`` and
    ``bits_per_byte``."""
    device = next(model.parameters()).device
    prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    windows, counts = [], {"documents": 0, "tokens": 0, "words": 0, "bytes": 0}
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            continue
        if max_tokens is not None and counts["tokens"] + len(ids) > max_tokens:
            ids = ids[:max_tokens - counts["tokens"]]
            text = tokenizer.decode(ids)  # words and bytes of the part scored
        full = [prefix, *ids]  # full[i] predicts ids[i]
        done = 0
        while done < len(ids):
            end = min(done + max_length, len(ids))
            start = max(0, end - max_length)  # as much context as the window holds
            windows.append((full[start:end], ids[start:end], done - start))  # inputs, targets, first scored
            done = end
        counts["documents"] += 1
        counts["tokens"] += len(ids)
        counts["words"] += len(re.split(r"\s+", text.strip()))
        counts["bytes"] += len(text.encode("utf-8"))
        if max_tokens is not None and counts["tokens"] >= max_tokens:
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
    if counts["tokens"] == 0:
        raise MixLNError("the documents give no tokens to score")
    return {**counts, "loss": total / counts["tokens"], "token_perplexity": math.exp(total / counts["tokens"]),
            "word_perplexity": math.exp(total / counts["words"]), "byte_perplexity": math.exp(total / counts["bytes"]),
            "bits_per_byte": total / counts["bytes"] / math.log(2)}


def check_finite_score(value: float, checkpoint, what: str) -> None:
    """A NaN or infinite perplexity is no figure to print with exit 0: refuse it, naming the checkpoint."""
    if not math.isfinite(value):
        raise MixLNError(f"{checkpoint}: its {what} is {value}: the model's outputs are not finite on this text "
                         "(a weight too large for float32 arithmetic, or a config value out of range)")


@dataclass
class Scoring:
    """What `eval` will score, read and checked before any model runs (or any task): the open
    checkpoint, the held-out documents and, when packed, their blocks."""

    source: object  # an open :class:`~.io.loader.Checkpoint`
    data: str | None
    seq_len: int
    max_tokens: int
    texts: list[str] | None  # None: only greedy continuations asked for
    blocks: object | None  # [n, seq_len] token ids, None when not packed


def prepare_scoring(ckpt, *, data=None, seq_len: int = EVAL_SEQ_LEN, max_tokens: int = EVAL_TOKENS,
                    allow_longer: bool = False, packed: bool = True, per_document: bool = False) -> Scoring:
    """Open ``ckpt`` (a path or an open Checkpoint), check ``seq_len`` against it and read the
    held-out text ``data`` (default: the embedded validation split): every refusal comes here."""
    from .data import read_texts, token_blocks
    from .io.loader import open_checkpoint

    check_tokens("--max-tokens", max_tokens)
    source = open_checkpoint(ckpt)
    if not (packed or per_document):  # greedy continuations only: no text, no blocks
        return Scoring(source, data, seq_len, max_tokens, None, None)
    check_seq_len("--seq-len", seq_len, source.config, "--allow-longer", allow_longer)
    texts = read_texts(data, split="validation")
    blocks = token_blocks(source.tokenizer, texts, seq_len, max_tokens, source=data or EVAL_DATA) if packed else None
    return Scoring(source, data, seq_len, max_tokens, texts, blocks)


def run_scoring(scoring: Scoring, model=None, *, batch_size: int = BATCH_SIZE, per_document: bool = False,
                generate: bool = False, progress: bool = True) -> dict:
    """The prepared text scored: packed blocks when prepared so, with ``per_document`` each
    document on its own (``per_document`` key), with ``generate`` greedy continuations of fixed
    prompts (``generation`` key). ``model``: the checkpoint's model when the caller has it loaded."""
    check_batch_size("--batch-size", batch_size)
    source = scoring.source
    model = model if model is not None else source.model()
    result = {"checkpoint": str(source.path), "data": str(scoring.data) if scoring.data else EVAL_DATA,
              "seq_len": scoring.seq_len}
    if scoring.blocks is not None:
        result.update(evaluate_perplexity(model, scoring.blocks, batch_size, progress))
        check_finite_score(result["perplexity"], source.path, "perplexity")
    if per_document:
        result["per_document"] = evaluate_documents(model, source.tokenizer, scoring.texts, scoring.seq_len,
                                                    batch_size, scoring.max_tokens, progress)
        check_finite_score(result["per_document"]["token_perplexity"], source.path, "per-document perplexity")
    if generate:
        from .generation import greedy_continuations

        result["generation"] = greedy_continuations(model, source.tokenizer, progress=progress)
    return result


def score_checkpoint(ckpt, *, data=None, seq_len: int = EVAL_SEQ_LEN, max_tokens: int = EVAL_TOKENS,
                     batch_size: int = BATCH_SIZE, per_document: bool = False, generate: bool = False,
                     allow_longer: bool = False, progress: bool = True) -> dict:
    """``ckpt`` scored on the first ``max_tokens`` tokens of ``data`` in packed blocks of
    ``seq_len``, and as :func:`run_scoring` says: what ``mixln-convert eval`` prints."""
    scoring = prepare_scoring(ckpt, data=data, seq_len=seq_len, max_tokens=max_tokens, allow_longer=allow_longer,
                              per_document=per_document)
    return run_scoring(scoring, batch_size=batch_size, per_document=per_document, generate=generate,
                       progress=progress)
