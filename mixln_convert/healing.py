"""``heal()``: cheap recovery of a converted model by distilling only its Post-LN blocks.

Most of what a conversion breaks sits in the first ``post_ln_layers`` (k) blocks, and the
original model is there to teach them. Only those blocks (attention, MLP and their norms) are
trained, so that the residual stream they hand to the first Pre-LN block matches the original's
on the same tokens. Forward and backward run through the k blocks only and the teacher's prefix
(embeddings + k blocks) runs without gradients, so a step costs about k/L of a training step.

Losses:

- ``residual``: per-token relative error of that stream, mean_t |s_t - t_t|^2 / |t_t|^2, so that
  the few tokens with massive activations (RMS in the thousands) do not set the whole loss;
- ``kl`` (the default): KL(teacher || student) of the final next-token distributions; runs both
  whole models (still training the k blocks only), about 3.5x the FLOPs of a ``residual`` step at
  alpha 0.25, but it is the loss that recovers perplexity: matching the stream at one depth does
  not pin down what the later blocks read from it (measured curves: docs/measurements.md,
  ``benchmarks/heal_curve.py``).

Memory: the ``kl`` loss and the perplexity evaluations run both whole models, over one copy of
what the two share (embeddings, Pre-LN blocks, final norm, head: :mod:`.model.shared_tail`); beside
it there are only the teacher's first k blocks, the student's and their AdamW state. ``dtype``
"bf16" keeps every frozen weight in bf16 and computes under bf16 autocast; the trained blocks
and their optimizer state stay float32.

The result is a normal converted checkpoint: every tensor of the converted model, the healed
blocks' replaced, ``mixln_provenance["heal"]`` in config.json and ``heal_metrics.jsonl``
(one JSON object per step: step, tokens, loss, lr, seconds since the start; evaluations add
val_relative_error and, with ``perplexity``, val_loss and val_ppl).
"""

import contextlib
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from tqdm.auto import tqdm

from .architectures import architecture_for
from .data import PackedBlocks, TokenShards, blocks, read_texts, token_blocks, token_stream
from .errors import MixLNError
from .options import EVAL_DATA, EVAL_TOKENS, HEAL_BATCH_SIZE, HEAL_DTYPES, HEAL_LR, HEAL_SEQ_LEN, LOSSES
from .evaluate import evaluate_documents, evaluate_perplexity
from .fetch import cache_dir
from .io.loader import open_checkpoint
from .io.paths import check_destination, check_readable
from .io.writer import atomic_output_dir, parse_size, tool_stamp, write_atomic, write_checkpoint
from .limits import (check_fraction, check_nonnegative, check_one_step, check_positive, check_positive_float,
                     check_spike_factor, check_seed, check_seq_len)
from .model.prefix import load_prefix, prefix_names, prefix_of
from .model.modeling_mixln import enable_checkpointing
from .model.shared_tail import load_pair
from .training.loop import (NonFiniteStep, StepGuard, adamw, block_grad_norms, clip_gradients, parameter_groups,
                            take_step, warmup_cosine)





def heal(
    converted,
    teacher,
    out,
    *,
    data=None,
    tokens: int = 65_536,
    seq_len: int = HEAL_SEQ_LEN,
    batch_size: int = HEAL_BATCH_SIZE,
    lr: float = HEAL_LR,
    loss: str = "kl",
    sampled: float = 0.0,
    dtype: str = "fp32",
    activation_checkpointing: bool = False,
    warmup_ratio: float = 0.1,
    grad_clip: float = 1.0,
    spike_factor: float = 0.0,
    eval_tokens: int = EVAL_TOKENS,
    eval_data=None,
    perplexity: bool = True,
    eval_at=(),
    max_shard_size: str | int = "5GB",
    seed: int = 0,
    force: bool = False,
    progress: bool = True,
    seq_len_flag: str | None = "--seq-len",
) -> dict:
    """Heal the Mix-LN checkpoint ``converted`` against its Pre-LN original ``teacher``; write ``out``.

    Trains the Post-LN blocks on ``tokens`` tokens of ``data`` (a file, folder or glob, a list of
    documents or a 1-D token stream; default the embedded corpus's train split) in batches of ``batch_size`` x ``seq_len``,
    AdamW at peak ``lr`` with linear warmup over ``warmup_ratio`` of the steps then cosine decay,
    gradients clipped to ``grad_clip``. A share ``sampled`` of the training sequences is instead
    written by the teacher itself (:func:`teacher_samples`), so that the student also learns the
    teacher's distribution on text like the teacher's own, not only on ``data``'s. Before and
    after (and after each token count in ``eval_at``) it measures, on ``eval_tokens`` tokens of
    ``eval_data`` (a file, folder or glob; default the embedded validation split), the residual
    relative error and, with ``perplexity``, the perplexity of the whole model in packed blocks
    and with each document scored on its own (the teacher's once per run, for reference).
    ``dtype``: of the frozen weights, "fp32" or "bf16" (see the module's docstring).
    ``activation_checkpointing``: keep only each block's input through a training step and
    recompute the rest in the backward (one more forward of the blocks the loss runs through, for
    activations that no longer grow with the depth: see :func:`_recomputing`), and with the ``kl``
    loss the logits too, a chunk of tokens at a time (:func:`chunked_kl`).
    ``seq_len_flag``: the option or recipe key that set ``seq_len``, for messages (None: the caller
    fixes the length).

    Returns ``out``, ``post_ln_layers``, ``steps``, ``tokens``, ``loss``, ``lr``, ``seconds``,
    ``relative_error`` and ``perplexity`` (each {"before", "after"}; perplexity also "teacher",
    None without ``perplexity``).
    """
    if loss not in LOSSES:
        raise MixLNError(f"--loss: unknown loss {loss!r} (choose from {', '.join(LOSSES)})")
    if dtype not in HEAL_DTYPES:
        raise MixLNError(f"--dtype: unknown dtype {dtype!r} (choose from {', '.join(HEAL_DTYPES)})")
    for flag, value in (("--tokens", tokens), ("--seq-len", seq_len), ("--batch-size", batch_size),
                        ("--eval-tokens", eval_tokens)):
        check_positive(flag, value)
    check_positive_float("--lr", lr)
    check_fraction("warmup_ratio", warmup_ratio, high_open=True)
    check_fraction("--sampled", sampled)
    if sampled and not (perplexity or loss == "kl"):
        raise MixLNError("--sampled: the teacher writes the samples with its whole model, which only --loss kl "
                         "or --perplexity loads")
    check_nonnegative("grad_clip", grad_clip)
    check_spike_factor("--spike-factor", spike_factor)
    check_seed(seed)
    check_one_step(tokens, batch_size, seq_len)
    steps = tokens // (batch_size * seq_len)
    max_shard_bytes = parse_size(max_shard_size)
    given = isinstance(data, (list, np.ndarray, TokenShards))  # documents or a token stream in hand, not a path
    inputs = {"CONVERTED": converted, "--teacher": teacher, "--data": None if given else data,
              "--eval-data": eval_data}
    for flag in ("--data", "--eval-data"):
        if inputs[flag] is not None:
            check_readable(inputs[flag], flag)
    check_destination(out, inputs, force, flag="--out")
    student_source, teacher_source = _open_pair(converted, teacher)
    check_seq_len(seq_len_flag or "seq_len", seq_len, student_source.config)
    arch = student_source.arch
    tokenizer = _same_tokenizer(student_source, teacher_source)
    k = student_source.config["post_ln_layers"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    frozen = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]

    def precision():
        """bf16 compute over bf16 frozen weights (autocast; the trained blocks stay float32 masters)."""
        return torch.autocast(device, torch.bfloat16) if frozen == torch.bfloat16 else contextlib.nullcontext()

    with atomic_output_dir(out, force=force, protect=inputs) as tmp:
        started = time.time()
        if isinstance(data, (np.ndarray, TokenShards)):
            stream = data
        else:
            texts = data if isinstance(data, list) else read_texts(data, split="train")
            stream = token_stream(tokenizer, texts, tokens, _describe(data))
        train_blocks = blocks(stream, seq_len, _describe(data), seq_len_flag)
        documents = read_texts(eval_data, split="validation")  # scored packed, and one by one from their first tokens
        eval_blocks = token_blocks(tokenizer, documents, seq_len, eval_tokens, source=eval_data or EVAL_DATA)
        unshared = []
        if perplexity or loss == "kl":
            full, teacher_model, unshared = load_pair(student_source, teacher_source, arch, k, frozen, device)
            student = prefix_of(full, student_source, arch, k)  # the very blocks the whole model runs
            teacher_prefix = prefix_of(teacher_model, teacher_source, arch, k)
        else:
            full = teacher_model = None
            student = load_prefix(student_source, arch, k, device=device)
            student.embed_tokens.requires_grad_(False)  # only the Post-LN blocks learn
            teacher_prefix = load_prefix(teacher_source, arch, k, frozen, device)
        trained = full.model if full is not None and loss == "kl" else student  # what the loss runs through
        if activation_checkpointing:
            # non-reentrant: the first block's input (the frozen embeddings' output) needs no gradient
            enable_checkpointing(trained, {"use_reentrant": False})
        if unshared:
            print(f"warning: --teacher {teacher}: {len(unshared)} tensors outside the first {k} blocks differ "
                  f"from {converted}'s (the first: {unshared[0]}); the teacher keeps its own copies of those",
                  file=sys.stderr)
        teacher_ppl = teacher_doc_ppl = None
        if perplexity:  # the teacher does not change: once, and kept for the next heal against it
            def measure_teacher() -> dict:
                with precision():
                    return {"packed": evaluate_perplexity(teacher_model, eval_blocks, batch_size, progress)["perplexity"],
                            "per_document": evaluate_documents(teacher_model, tokenizer, documents, seq_len,
                                                               batch_size, eval_tokens, progress)["token_perplexity"]}

            figures = cached_teacher_metrics(
                measure_teacher, teacher=teacher_source.fingerprint(), blocks=_digest(eval_blocks.numpy().tobytes()),
                documents=_digest("\0".join(documents).encode()), seq_len=seq_len, eval_tokens=eval_tokens,
                batch_size=batch_size, dtype=dtype, device=device, torch=torch.__version__)
            teacher_ppl, teacher_doc_ppl = figures["packed"], figures["per_document"]

        def evaluate() -> dict:
            with precision():
                measured = held_out(student, teacher_prefix, full if perplexity else None, eval_blocks, batch_size,
                                    progress)
                if perplexity:
                    measured["val_doc_ppl"] = evaluate_documents(full, tokenizer, documents, seq_len, batch_size,
                                                                 eval_tokens, progress)["token_perplexity"]
            return measured

        before = evaluate()
        n_sampled = round(sampled * steps * batch_size)
        if n_sampled:
            train_blocks = MixedBlocks(train_blocks, steps * batch_size - n_sampled, teacher_samples(
                teacher_model, tokenizer, n_sampled, seq_len, seed, precision, progress))
        parameters = list(student.layers.parameters())
        # No weight decay: it would pull the pretrained weights toward 0, away from the teacher. Every
        # trained block is a Post-LN block, so --lr is their learning rate.
        optimizer = adamw(parameter_groups(student.layers, [], lr=lr, weight_decay=0.0))
        scheduler = warmup_cosine(optimizer, round(warmup_ratio * steps), steps)
        guard = StepGuard(spike_factor)
        batches = torch.utils.data.DataLoader(PackedBlocks(train_blocks, steps * batch_size, seed),
                                              batch_size=batch_size)
        pending, losses = sorted(eval_at), []
        with open(tmp / "heal_metrics.jsonl", "w") as metrics:
            metrics.write(json.dumps({"step": 0, "tokens": 0, **before}) + "\n")
            bar = tqdm(batches, total=steps, desc="healing", unit="step", disable=not progress)
            for step, batch in enumerate(bar, 1):
                batch = batch.to(device)
                with precision(), _recomputing(trained.layers, activation_checkpointing):
                    if loss == "residual":
                        with torch.no_grad():
                            target = teacher_prefix(input_ids=batch).last_hidden_state
                        value = relative_error(student(input_ids=batch).last_hidden_state, target)
                    elif activation_checkpointing:  # the logits too are recomputed, a chunk of tokens at a time
                        with torch.no_grad():
                            target = teacher_model.model(input_ids=batch).last_hidden_state
                        value = chunked_kl(full.model(input_ids=batch).last_hidden_state, target, full.lm_head,
                                           teacher_model.lm_head)
                    else:  # the teacher's logits change with every batch: not cacheable, unlike its metrics
                        with torch.no_grad():
                            target = teacher_model(input_ids=batch).logits
                        value = distribution_kl(full(input_ids=batch).logits, target)
                value.backward()  # a checkpointed block's recompute restores the forward's autocast state
                try:
                    taken = take_step(optimizer, scheduler, guard, step=step, loss=value.item(),
                                      clip=lambda: clip_gradients(parameters, grad_clip),
                                      block_norms=lambda: (block_grad_norms(student.layers), student.layers),
                                      samples=range((step - 1) * batch_size, step * batch_size))
                except NonFiniteStep as e:
                    raise MixLNError(f"--lr: the heal's {loss} {e}; the heal diverged at lr {lr:g}: try a smaller "
                                     "--lr") from None
                record = {"step": step, "tokens": step * batch.numel(), **taken,
                          "seconds": round(time.time() - started, 2)}
                if (pending and record["tokens"] >= pending[0]) or step == steps:
                    pending = [t for t in pending if t > record["tokens"]]
                    record.update(evaluate())
                    _check_finite(record, lr)
                metrics.write(json.dumps(record) + "\n")
                losses.append(record["loss"])
                bar.set_postfix(loss=f"{record['loss']:.4f}")
        _warn_if_worse(losses, before.get("val_ppl"), record.get("val_ppl"), lr, before.get("val_doc_ppl"),
                       record.get("val_doc_ppl"))

        result = {
            "out": str(out), "post_ln_layers": k, "steps": steps, "tokens": record["tokens"], "loss": loss,
            "sampled": sampled, "lr": lr, "dtype": dtype, "activation_checkpointing": activation_checkpointing,
            "relative_error": {"before": before["val_relative_error"], "after": record["val_relative_error"]},
            "perplexity": {"teacher": teacher_ppl, "before": before["val_ppl"], "after": record["val_ppl"]}
            if perplexity else None,
            "per_document_perplexity": {"teacher": teacher_doc_ppl, "before": before["val_doc_ppl"],
                                        "after": record["val_doc_ppl"]} if perplexity else None,
            "evaluation": {"data": str(eval_data) if eval_data else EVAL_DATA, "tokens": eval_blocks[:, 1:].numel(),
                           "seq_len": seq_len},
            "seconds": round(time.time() - started, 2),
        }
        state = student.state_dict()
        healed = {name: state[name.removeprefix("model.")] for name in prefix_names(student_source, arch, k)
                  if arch.layer_of(name) is not None}
        # Only the healed blocks are needed from here: the writer holds an output shard's tensors at once,
        # which on top of both models and the AdamW state would set the peak.
        del state
        student = teacher_prefix = full = teacher_model = parameters = optimizer = scheduler = None
        record = tool_stamp(teacher=str(Path(teacher).absolute()), data=_describe(data), seq_len=seq_len,
                            batch_size=batch_size, **{key: value for key, value in result.items() if key != "out"})
        config = dict(student_source.config)
        config["mixln_provenance"] = {**(config.get("mixln_provenance") or {}), "heal": record}
        write_checkpoint(tmp, _healed_tensors(student_source, healed), config, student_source, max_shard_bytes,
                         desc="writing", total=len(student_source.names()), progress=progress)
    return result


SAMPLE_BATCH = 16  # sequences the teacher writes at once


@torch.no_grad()
def teacher_samples(model, tokenizer, count: int, seq_len: int, seed: int, precision, progress: bool) -> np.ndarray:
    """[count, seq_len] token ids ``model`` writes itself: each sequence its BOS token (EOS where
    there is none) and ``seq_len - 1`` tokens of pure sampling (temperature 1, no top-k or top-p,
    EOS suppressed so every sequence is full), seeded by ``seed`` without touching the global RNG."""
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    rows = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), precision():
        torch.manual_seed(seed)
        for first in tqdm(range(0, count, SAMPLE_BATCH), desc="teacher writing", unit="batch", disable=not progress):
            ids = torch.full((min(SAMPLE_BATCH, count - first), 1), start, device=device)
            written = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                     use_cache=True,  # the heal's models are built without: O(n) steps, not O(n^2)
                                     top_k=0, top_p=1.0, max_new_tokens=seq_len - 1, min_new_tokens=seq_len - 1,
                                     eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
            rows.append(written.cpu().numpy())
    return np.concatenate(rows)


class MixedBlocks:
    """The first ``count`` blocks of ``blocks``, then every block of ``extra``: one set of
    training blocks for :class:`PackedBlocks` to draw from."""

    def __init__(self, blocks, count: int, extra: np.ndarray):
        self.blocks, self.count, self.extra = blocks, min(count, len(blocks)), extra

    def __len__(self) -> int:
        return self.count + len(self.extra)

    def __getitem__(self, i: int):
        return self.blocks[i] if i < self.count else self.extra[i - self.count]


def cached_teacher_metrics(measure, **key) -> dict:
    """``measure()``'s figures, kept in the user cache under ``key`` (everything they depend on:
    the teacher's files, the scored tokens and documents, the settings): a sweep or a rerun heals
    against the same teacher many times. An unreadable cache entry is measured again."""
    path = cache_dir() / "teacher-metrics" / f"{_digest(json.dumps(key, sort_keys=True).encode())}.json"
    try:
        figures = json.loads(path.read_text())
        if all(isinstance(figures.get(k), float) for k in ("packed", "per_document")):
            return figures
    except (OSError, ValueError):
        pass
    figures = measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(figures) + "\n")
    except OSError as e:  # a cache that cannot be written costs the next run a measurement, nothing more
        print(f"warning: {path.parent}: cannot keep the teacher's figures ({e.strerror})", file=sys.stderr)
    return figures


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _warn_if_worse(losses: list[float], ppl_before, ppl_after, lr: float, doc_before=None, doc_after=None) -> None:
    """A heal that ends worse than it started (training loss over its last tenth of steps above the
    first step's, or held-out perplexity up) has almost always diverged; say so, still writing it.
    Per-document perplexity up while packed went down is a heal too short for the first positions
    of a document (measured: docs/measurements.md), not a divergence."""
    tail = losses[-max(1, len(losses) // 10):]
    signs = []
    if len(losses) > 1 and sum(tail) / len(tail) > losses[0]:
        signs.append(f"its loss ended at {sum(tail) / len(tail):.4g}, above the first step's {losses[0]:.4g}")
    if ppl_before is not None and ppl_after > ppl_before:
        signs.append(f"held-out perplexity rose from {ppl_before:.4g} to {ppl_after:.4g}")
    if signs:
        print(f"warning: the heal made the model worse ({'; '.join(signs)}): --lr {lr:g} is probably too high "
              f"for this model; try {lr / 3:.1g}", file=sys.stderr)
    elif doc_before is not None and doc_after > doc_before:
        print(f"warning: the heal made per-document perplexity worse ({doc_before:.4g} -> {doc_after:.4g}, each "
              "document scored from its first token, as lm-evaluation-harness does) while packed perplexity fell: "
              "too few tokens for the first positions of a document to recover; heal on more --tokens",
              file=sys.stderr)


@contextlib.contextmanager
def _recomputing(layers, enabled: bool):
    """Around a training forward: the blocks ``layers`` in training mode, the one state in which
    transformers checkpoints them (see :func:`heal`'s ``activation_checkpointing``). The blocks
    alone are switched, not their submodules, so attention stays in eval mode (no dropout: a heal
    distils, it does not regularize), and the evaluations between steps find them unchanged."""
    for layer in layers if enabled else ():
        layer.training = True
    try:
        yield
    finally:
        for layer in layers if enabled else ():
            layer.training = False


def _check_finite(record: dict, lr: float) -> None:
    """A heal whose held-out figures are no longer numbers has diverged: it must not be written."""
    for key in ("val_relative_error", "val_ppl", "val_doc_ppl"):
        if key in record and not math.isfinite(record[key]):
            raise MixLNError(f"--lr: the healed model's held-out {key} is {record[key]} at step {record['step']}; "
                             f"the heal diverged at lr {lr}: try a smaller --lr")


def _describe(data) -> str:
    if isinstance(data, (np.ndarray, TokenShards)):
        return f"a stream of {len(data)} tokens given"
    if isinstance(data, list):
        return f"{len(data)} documents given"
    return str(data) if data else "embedded:train"


def _open_pair(converted, teacher):
    """The converted checkpoint and its teacher, refusing pairs that cannot be healed."""
    student_source = open_checkpoint(converted)
    config = student_source.config
    if not student_source.is_mixln:
        raise MixLNError(f"{converted}: not a Mix-LN checkpoint (model_type {config.get('model_type')!r}); "
                         "convert it first (mixln-convert convert)")
    k = config.get("post_ln_layers", 0)
    if k == 0:
        raise MixLNError(f"{converted}: has no Post-LN layer (post_ln_layers 0); there is nothing to heal")
    teacher_source = open_checkpoint(teacher)
    if teacher_source.is_mixln:
        raise MixLNError(f"--teacher {teacher}: a Mix-LN checkpoint; the teacher is the Pre-LN model {converted} "
                         "was converted from")
    family = architecture_for(teacher_source.config, f"--teacher {teacher}")
    if family.converted["model_type"] != config["model_type"]:  # its blocks would be run as another family's
        raise MixLNError(f"--teacher {teacher}: a {family.name} checkpoint, but {converted} is a "
                         f"{config['model_type']} one; give the model it was converted from")
    def shape(config: dict, key: str):
        return config.get(key) or (config.get("num_attention_heads") if key == "num_key_value_heads" else None)

    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "vocab_size"):
        if shape(teacher_source.config, key) != shape(config, key):
            raise MixLNError(f"--teacher {teacher}: {key} {shape(teacher_source.config, key)} differs from "
                             f"{converted}'s {shape(config, key)}; give the model it was converted from")
    return student_source, teacher_source


def _same_tokenizer(student_source, teacher_source):
    """The converted model's tokenizer, after checking that the teacher reads text the same way."""
    tokenizer = student_source.tokenizer
    if teacher_source.tokenizer.get_vocab() != tokenizer.get_vocab():
        raise MixLNError(f"--teacher {teacher_source.path}: its tokenizer differs from {student_source.path}'s; "
                         "give the model it was converted from")
    return tokenizer


def relative_error(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """mean over tokens of |s_t - t_t|^2 / |t_t|^2 ([..., hidden] tensors)."""
    return ((student - teacher).pow(2).sum(-1) / teacher.pow(2).sum(-1)).mean()


def chunked_kl(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, student_head, teacher_head,
               chunk_tokens: int = 128) -> torch.Tensor:
    """:func:`distribution_kl` of ``student_head(student_hidden)`` against ``teacher_head(teacher_hidden)``
    (final hidden states, [..., hidden]), ``chunk_tokens`` positions at a time: each chunk's logits
    are recomputed in the backward instead of kept, so a step holds one chunk's vocabulary-sized
    tensors, not the whole batch's, for two more passes of the heads."""
    student_hidden, teacher_hidden = student_hidden.flatten(0, -2), teacher_hidden.flatten(0, -2)
    total = 0.0
    for start in range(0, len(student_hidden), chunk_tokens):
        chunk = slice(start, start + chunk_tokens)
        total = total + checkpoint(_kl_sum, student_hidden[chunk], teacher_hidden[chunk], student_head, teacher_head,
                                   use_reentrant=False)
    return total / len(student_hidden)


def _kl_sum(student_hidden, teacher_hidden, student_head, teacher_head) -> torch.Tensor:
    with torch.no_grad():
        target = F.log_softmax(teacher_head(teacher_hidden).float(), -1)
    return F.kl_div(F.log_softmax(student_head(student_hidden).float(), -1), target, log_target=True, reduction="sum")


def distribution_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) of the next-token distributions, averaged over tokens."""
    return F.kl_div(F.log_softmax(student_logits.float().flatten(0, -2), -1),
                    F.log_softmax(teacher_logits.float().flatten(0, -2), -1), log_target=True, reduction="batchmean")


@torch.no_grad()
def held_out(student, teacher_prefix, model, blocks: torch.Tensor, batch_size: int, progress: bool) -> dict:
    """``val_relative_error`` of the student prefix against the teacher's on ``blocks``; with a whole
    ``model`` (whose first blocks are the student's) also its ``val_loss`` and ``val_ppl``."""
    device = next(student.parameters()).device
    errors = []
    for start in range(0, len(blocks), batch_size):
        batch = blocks[start:start + batch_size].to(device)
        stream = student(input_ids=batch).last_hidden_state
        errors.append(relative_error(stream, teacher_prefix(input_ids=batch).last_hidden_state).item() * len(batch))
    result = {"val_relative_error": sum(errors) / len(blocks)}
    if model is not None:
        measured = evaluate_perplexity(model, blocks, batch_size, progress)
        result.update(val_loss=measured["loss"], val_ppl=measured["perplexity"])
    return result


def _healed_tensors(source, healed: dict):
    """Every tensor of ``source``, those named in ``healed`` replaced (in the source's dtype)."""
    for name in source.names():
        tensor = source.get(name)
        yield name, healed[name].detach().to("cpu", tensor.dtype) if name in healed else tensor
