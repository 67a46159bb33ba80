"""Perplexity on held-out text."""

import math

import torch
from tqdm.auto import tqdm


@torch.no_grad()
def evaluate_perplexity(model, blocks: torch.Tensor, batch_size: int = 4, progress: bool = True) -> dict:
    """Token-level perplexity of ``model`` on ``blocks`` ([n, seq_len] token ids).

    Every position but the first of each block is predicted; returns ``perplexity``,
    ``loss`` (mean negative log-likelihood, nats) and ``tokens`` (positions scored).
    """
    device = next(model.parameters()).device
    total_nll, total_tokens = 0.0, 0
    for start in tqdm(range(0, len(blocks), batch_size), desc="evaluating", disable=not progress, leave=False):
        batch = blocks[start:start + batch_size].to(device)
        # the model's own loss, summed (num_items_in_batch=1): it shifts the labels rather than
        # copying the [batch, seq, vocab] logits
        total_nll += model(input_ids=batch, labels=batch, num_items_in_batch=1, use_cache=False).loss.item()
        total_tokens += batch[:, 1:].numel()
    loss = total_nll / total_tokens
    return {"perplexity": math.exp(loss), "loss": loss, "tokens": total_tokens}
