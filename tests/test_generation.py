"""eval --generate: greedy continuations of fixed prompts and their repeated-4-gram share."""

import json

import pytest
import torch

from mixln_convert.evaluation.generation import PROMPTS, greedy_continuations, repeated_ngram_share
from mixln_convert.surgery.loading import load_model, load_tokenizer


@pytest.mark.parametrize("ids, share", [
    ([1, 2, 3, 4, 5, 6], 0.0),
    ([1, 2, 3, 4, 1, 2, 3, 4], 1 / 5),  # 5 four-grams, the last one repeats the first
    ([7] * 10, 6 / 7),  # 7 four-grams, all but the first repeat
    ([1, 2, 3], 0.0),  # no four-gram at all
])
def test_repeated_ngram_share(ids, share):
    assert repeated_ngram_share(ids) == pytest.approx(share)


def test_greedy_continuations_are_the_argmax_decode(converted):
    model, tokenizer = load_model(converted), load_tokenizer(converted)
    result = greedy_continuations(model, tokenizer, prompts=PROMPTS[:2], new_tokens=12, progress=False)
    assert [c.prompt for c in result.continuations] == list(PROMPTS[:2])
    ids = tokenizer(PROMPTS[1], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        for _ in range(12):  # the plain loop: no cache, the argmax of the last position each time
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    reference = ids[0, -12:].tolist()
    assert result.continuations[1].text == tokenizer.decode(reference, skip_special_tokens=True)
    assert result.continuations[1].repeated_4gram_share == pytest.approx(repeated_ngram_share(reference))
    shares = [c.repeated_4gram_share for c in result.continuations]
    assert result.repeated_4gram_share == pytest.approx(sum(shares) / 2)


def test_eval_generate_json(cli, converted):
    result = cli("eval", converted, "--seq-len", 32, "--max-tokens", 64, "--generate", "--json")
    assert result.exit_code == 0, result.output
    generation = json.loads(result.stdout.splitlines()[-1])["generation"]
    assert len(generation["continuations"]) == len(PROMPTS) == 24
    assert 0 <= generation["repeated_4gram_share"] <= 1


def test_left_padded_batches_write_what_one_prompt_at_a_time_writes(converted):
    model, tokenizer = load_model(converted), load_tokenizer(converted)
    alone = greedy_continuations(model, tokenizer, new_tokens=16, progress=False, batch_size=1)
    batched = greedy_continuations(model, tokenizer, new_tokens=16, progress=False)
    assert len({len(tokenizer(p)["input_ids"]) for p in PROMPTS[:8]}) > 1  # the first batch is padded
    assert batched == alone


def test_the_progress_bar_moves_every_decoding_step(converted, monkeypatch):
    """A batch of 8 prompts x 64 tokens takes minutes on a slow CPU: the bar must move per decoding step, not
    per batch (the demo was silent for 132 s between "0/24" and "8/24")."""
    import mixln_convert.evaluation.generation as generation

    updates = []

    class Recorder(generation.tqdm):
        def update(self, n=1):
            updates.append(n)
            return super().update(n)

    monkeypatch.setattr(generation, "tqdm", Recorder)
    model, tokenizer = load_model(converted), load_tokenizer(converted)
    greedy_continuations(model, tokenizer, prompts=PROMPTS[:3], new_tokens=6, progress=True, batch_size=2)
    assert len(updates) >= 2 * 6 and sum(updates) == 2 * 6  # two batches, six steps each
