"""What a model writes: greedy continuations of fixed prompts, and how much of each continuation
repeats itself (the share of its 4-grams already seen earlier in it). Perplexity near the
original's can hide a converted model that loops ("it's a file that's a file that's a file");
this is the figure that shows it."""

import torch
from tqdm.auto import tqdm

from .result import Continuation, Generation

# Fixed, varied openings (facts, how-to, narrative, code prose); 24 of them so a share is not one prompt's.
PROMPTS = (
    "The capital of France is",
    "A pipe in Unix is",
    "To make a cup of tea, first",
    "The main difference between a list and a tuple in Python is",
    "Once upon a time, in a small village by the sea,",
    "The water cycle describes how",
    "In 1969, the first humans",
    "A good way to learn a new language is",
    "The function below returns the sum of",
    "Photosynthesis is the process by which",
    "My favourite thing about autumn is",
    "The recipe calls for two eggs, a cup of flour and",
    "A binary search works by",
    "The train was late again, so",
    "Gravity is the force that",
    "When you open a file for writing,",
    "The museum's new exhibition shows",
    "An operating system manages",
    "The doctor told him that",
    "Regular expressions are used to",
    "The history of the printing press begins",
    "If the temperature drops below zero,",
    "A prime number is",
    "The meeting was moved to Thursday because",
)
NEW_TOKENS = 64
NGRAM = 4


def repeated_ngram_share(ids: list[int], n: int = NGRAM) -> float:
    """Share of the n-grams of ``ids`` that already occurred earlier in ``ids`` (0: no repetition)."""
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return (len(grams) - len(set(grams))) / len(grams) if grams else 0.0


def _decoding_steps(bar):
    """A stopping criterion that never stops: it moves ``bar`` one decoding step on, so a slow CPU shows
    progress every few seconds, not once per batch of prompts (minutes)."""
    def step(input_ids, scores, **kwargs):
        bar.update(1)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    return step


@torch.no_grad()
def greedy_continuations(model, tokenizer, prompts=PROMPTS, new_tokens: int = NEW_TOKENS,
                         progress: bool = True, batch_size: int = 8) -> Generation:
    """Each prompt's greedy continuation of ``new_tokens`` tokens (ending early only at EOS, which it
    keeps) and its repeated-4-gram share, and their mean. Prompts go ``batch_size`` at a time,
    left-padded: a decoding step costs about the same for 1 or 8 sequences on a CPU."""
    from transformers import StoppingCriteriaList

    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    results = []
    batches = range(0, len(prompts), batch_size)
    with tqdm(total=len(batches) * new_tokens, desc=f"generating ({len(prompts)} prompts)", unit="step",
              disable=not progress, leave=False) as bar:
        for done, start in enumerate(batches, 1):
            batch = [tokenizer(prompt)["input_ids"] for prompt in prompts[start:start + batch_size]]
            width = max(map(len, batch))
            ids = torch.tensor([[pad] * (width - len(row)) + row for row in batch], device=device)
            mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in batch], device=device)
            out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=pad, stopping_criteria=StoppingCriteriaList([_decoding_steps(bar)]))
            for prompt, row in zip(prompts[start:], out[:, width:].tolist()):
                if tokenizer.eos_token_id in row:  # what follows a finished row's EOS is padding
                    row = row[:row.index(tokenizer.eos_token_id) + 1]
                results.append(Continuation(prompt=prompt, text=tokenizer.decode(row, skip_special_tokens=True),
                                            repeated_4gram_share=repeated_ngram_share(row)))
            bar.update(done * new_tokens - bar.n)  # the steps a batch ended early at EOS did not take
    return Generation(continuations=results, new_tokens=new_tokens,
                      repeated_4gram_share=sum(r.repeated_4gram_share for r in results) / len(results))
