"""Layer drop on an lm-evaluation-harness task: the task metric with block l skipped, minus the full
model's (the Mix-LN paper's per-layer figure). Every request is scored once for all L+1 variants, in
memory; lm-eval's metric pass is then replayed per variant from those scores, so the figures are
lm-eval's metrics of lm-eval's requests."""

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from tqdm.auto import tqdm

from ..evaluation.downstream import hf_lm, primary_metric, run_tasks
from .layers import BlockRunner
from .result import TaskDrop


class VariantScorer:
    """Scores lm-eval's (context, continuation) token requests under every variant in one pass.
    ``variants``: sets of blocks to skip (the empty set is the full model); ``scores[key][v]``: the
    continuation's (log-likelihood, whether greedy) under variant v, as lm-eval's HFLM defines both."""

    def __init__(self, model, variants: list[frozenset], max_length: int, batch_size: int, bar):
        self.runner = BlockRunner(model)
        self.variants = variants
        self.max_length = max_length
        self.batch_size = batch_size
        self.bar = bar  # one progress bar over every call: lm-eval asks for rolling windows batch by batch
        self.scores: dict[tuple, list[tuple[float, bool]]] = {}

    @torch.no_grad()
    def score(self, requests: list[tuple[list[int], list[int]]]) -> None:
        """Score the requests not scored yet; longest first, so each batch pads little."""
        todo = sorted({(tuple(c), tuple(k)) for c, k in requests} - self.scores.keys(), key=lambda r: -sum(map(len, r)))
        device = self.runner.model.device
        for start in range(0, len(todo), self.batch_size):
            batch = todo[start:start + self.batch_size]
            # as HFLM: the last max_length + 1 tokens, the last of them only predicted
            inputs = [(list(c) + list(k))[-(self.max_length + 1):][:-1] for c, k in batch]
            # right padding (zeros) changes no earlier position
            ids = pad_sequence([torch.tensor(tokens, dtype=torch.long) for tokens in inputs], batch_first=True)
            stream = self.runner.stream(ids.to(device))
            # the positions that predict each continuation: only they go through the head
            positions = [torch.arange(len(tokens) - len(k), len(tokens), device=device)
                         for tokens, (_, k) in zip(inputs, batch)]
            rows = torch.cat([torch.full_like(p, row) for row, p in enumerate(positions)])
            columns = torch.cat(positions)
            targets = torch.tensor([t for _, k in batch for t in k], device=device)
            lengths = [len(k) for _, k in batch]
            scores = [[] for _ in batch]
            for skip in self.variants:  # one variant's log-probabilities in memory at a time
                hidden = stream.residual[-1]
                if skip:
                    first = min(skip)
                    hidden = self.runner.run(stream.residual[first], stream.block_kwargs, first, skip)
                logprobs = F.log_softmax(self.runner.logits(hidden[rows, columns]).float(), dim=-1)
                picked = logprobs.gather(-1, targets[:, None])[:, 0].split(lengths)
                greedy = (logprobs.argmax(-1) == targets).split(lengths)
                for row in range(len(batch)):
                    scores[row].append((picked[row].sum().item(), bool(greedy[row].all())))
            self.scores.update(zip(batch, scores))
            self.bar.update(len(batch))


def _replaying_lm(model, tokenizer, batch_size: int, variants: list[frozenset], bar):
    """An HFLM whose loglikelihoods come from a :class:`VariantScorer`, for the variant in ``lm.variant``:
    lm-eval builds the requests (tokenization, rolling windows) and the metrics, the scorer the numbers."""
    from lm_eval.models.huggingface import HFLM

    class ReplayingLM(HFLM):
        variant = 0

        def _loglikelihood_tokens(self, requests, disable_tqdm=False, override_bs=None):
            pairs = [(context, continuation) for _, context, continuation in requests]
            self.scorer.score(pairs)
            return [self.scorer.scores[tuple(c), tuple(k)][self.variant] for c, k in pairs]

    lm = hf_lm(model, tokenizer, batch_size, ReplayingLM)
    lm.scorer = VariantScorer(model, variants, lm.max_length, batch_size, bar)
    return lm


def task_layer_drop(model, tokenizer, task: str, manager, *, limit: int | None = None, batch_size: int = 4,
                    progress: bool = True) -> TaskDrop:
    """``task``'s primary metric (the first its YAML lists) of the full model and with each block skipped.
    ``manager``: a TaskManager that knows ``task``."""
    num_layers = model.config.num_hidden_layers
    variants = [frozenset(), *(frozenset({l}) for l in range(num_layers))]
    values = []
    with tqdm(desc=f"{task}: requests scored, {len(variants)} variants each", unit="request",
              disable=not progress, leave=False) as bar:
        lm = _replaying_lm(model, tokenizer, batch_size, variants, bar)
        for variant in range(len(variants)):  # the first run scores, the others look the scores up
            lm.variant = variant
            result = run_tasks(lm, [task], manager, limit, bootstrap_iters=0)[task]
            values.append(result.metrics[primary_metric(result)])
    metric = primary_metric(result)
    return TaskDrop(task=task, metric=metric, higher_is_better=result.higher_is_better[metric], value=values[0],
                    layer_drop=[v - values[0] for v in values[1:]], samples=result.samples, limit=limit)
