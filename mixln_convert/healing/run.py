"""One heal, in the training loop's order: check -> setup -> fit (validating as it goes) -> save."""

import contextlib
import json
import time
from dataclasses import KW_ONLY, dataclass, fields
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ..data import PackedWindows, TokenShards, read_texts, token_stream, token_windows, windows
from ..errors import MixLNError, warn
from ..evaluation.perplexity import evaluate_documents, evaluate_perplexity
from ..io.atomic import atomic_output_dir
from ..io.paths import check_destination, check_readable, checkpoint_path
from ..io.writer import tool_stamp, write_checkpoint
from ..limits import check_seq_len
from ..model.modeling_mixln import enable_checkpointing
from ..options import EVAL_DATA, HEAL_BETAS, HealOptions
from ..runtime import map_large_allocations
from ..surgery.prefix import prefix_names
from ..training.loop import (NonFiniteStep, StepGuard, adamw, block_grad_norms, clip_gradients, parameter_groups,
                             take_step, warmup_cosine)
from .losses import distillation_loss, relative_error
from .metrics import cached_teacher_metrics, check_record_finite, digest, warn_if_worse
from .pair import load_models, open_pair, same_tokenizer
from .result import HealResult


def heal(converted, teacher, out, options: HealOptions | None = None, **settings) -> HealResult:
    """Heal the Mix-LN checkpoint ``converted`` against its Pre-LN original ``teacher``; write ``out``.
    ``options``: a :class:`~mixln_convert.options.HealOptions`; ``settings``: :class:`HealRun`'s
    keyword fields (with ``options``, those replaced). Returns :meth:`HealRun.summary`."""
    given = {f.name: getattr(options, f.name) for f in fields(options)} if options is not None else {}
    return HealRun(converted, teacher, out, **{**given, **settings}).run()


@dataclass
class HealRun(HealOptions):
    """A heal of ``converted``'s Post-LN blocks against ``teacher``, written to ``out``, with the
    :class:`~mixln_convert.options.HealOptions` (``data`` also a list of documents or a 1-D token stream).
    ``activation_checkpointing``: keep only each block's input through a training step and recompute
    the rest in the backward (one more forward, for activations that no longer grow with the depth: see
    :func:`_recomputing`), and with the ``kl`` loss the logits too (:class:`.losses.ChunkedKL`).
    ``seq_len_flag``: the option or recipe key that set ``seq_len``, for messages (None: the caller fixes the length).
    """

    converted: str | Path
    teacher: str | Path
    out: str | Path
    _: KW_ONLY  # the options (HealOptions' too), keyword-only as heal() takes them
    force: bool = False
    progress: bool = True
    seq_len_flag: str | None = "--seq-len"

    def run(self) -> HealResult:
        map_large_allocations()
        inputs = self.check()
        with atomic_output_dir(self.out, force=self.force, protect=inputs) as tmp:
            self.setup()
            before = self.validate()
            after = self.fit(before, tmp / "heal_metrics.jsonl")
            result = self.summary(before, after)
            self.save(tmp, result)
        return result

    def check(self) -> dict:
        """Every check that needs no model (the numbers were checked when the run was made), before
        anything is written, and the pair opened; returns the inputs the output must not replace."""
        self.steps = self.tokens // (self.batch_size * self.seq_len)
        self.converted = checkpoint_path(self.converted, "CONVERTED")
        self.teacher = checkpoint_path(self.teacher, "--teacher")
        in_hand = isinstance(self.data, (list, np.ndarray, TokenShards))  # documents or a token stream, not a path
        inputs = {"CONVERTED": self.converted, "--teacher": self.teacher, "--data": None if in_hand else self.data,
                  "--eval-data": self.eval_data}
        for flag in ("--data", "--eval-data"):
            check_readable(inputs[flag], flag)
        check_destination(self.out, inputs, self.force, flag="--out")
        self.student_source, self.teacher_source = open_pair(self.converted, self.teacher)
        check_seq_len(self.seq_len_flag or "seq_len", self.seq_len, self.student_source.config)
        self.tokenizer = same_tokenizer(self.student_source, self.teacher_source)
        self.post_ln_layers = self.student_source.config["post_ln_layers"]
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        return inputs

    def setup(self) -> None:
        """The training and held-out windows, the models, the loss, and the teacher's figures."""
        self.started = time.time()
        if isinstance(self.data, (np.ndarray, TokenShards)):
            stream = self.data
        else:
            texts = self.data if isinstance(self.data, list) else read_texts(self.data, split="train")
            stream = token_stream(self.tokenizer, texts, self.tokens, _describe(self.data))
        self.train_windows = windows(stream, self.seq_len, _describe(self.data), self.seq_len_flag)
        self.documents = read_texts(self.eval_data, split="validation")  # scored packed, and one by one
        self.eval_windows = token_windows(self.tokenizer, self.documents, self.seq_len, self.eval_tokens,
                                          source=self.eval_data or EVAL_DATA)
        loss_class = distillation_loss(self.loss, self.activation_checkpointing)
        self.models = load_models(self.student_source, self.teacher_source, self.post_ln_layers,
                                  {"fp32": torch.float32, "bf16": torch.bfloat16}[self.dtype], self.device,
                                  whole=self.perplexity or loss_class.whole_models)
        self.objective = loss_class(self.models)
        if self.activation_checkpointing:
            # non-reentrant: the first block's input (the frozen embeddings' output) needs no gradient
            enable_checkpointing(self.objective.runs_through, {"use_reentrant": False})
        if self.models.unshared:
            warn(f"--teacher {self.teacher}: {len(self.models.unshared)} tensors outside the first "
                 f"{self.post_ln_layers} "
                 f"blocks differ from {self.converted}'s (the first: {self.models.unshared[0]}); the teacher keeps "
                 "its own copies of those")
        self.teacher_figures = self.measure_teacher() if self.perplexity else None

    def precision(self):
        """bf16 compute over bf16 frozen weights (autocast; the trained blocks stay float32 masters)."""
        return torch.autocast(self.device, torch.bfloat16) if self.dtype == "bf16" else contextlib.nullcontext()

    def measure_teacher(self) -> dict:
        """The teacher's perplexity, packed and per document: it does not change, so it is measured
        once and kept for the next heal against it."""
        def measure() -> dict:
            teacher = self.models.teacher_model
            with self.precision():
                return {"packed": evaluate_perplexity(teacher, self.eval_windows, self.batch_size,
                                                      self.progress)["perplexity"],
                        "per_document": evaluate_documents(teacher, self.tokenizer, self.documents, self.seq_len,
                                                           self.batch_size, self.eval_tokens,
                                                           self.progress)["token_perplexity"]}

        return cached_teacher_metrics(
            measure, teacher=self.teacher_source.fingerprint(), windows=digest(self.eval_windows.numpy().tobytes()),
            documents=digest("\0".join(self.documents).encode()), seq_len=self.seq_len, eval_tokens=self.eval_tokens,
            batch_size=self.batch_size, dtype=self.dtype, device=self.device, torch=torch.__version__)

    def validate(self) -> dict:
        """The student's held-out figures as they stand: ``val_relative_error`` of its prefix's stream;
        with ``perplexity`` ``val_loss``, ``val_ppl`` (packed windows) and ``val_doc_ppl`` (per document)."""
        models, held_out, errors = self.models, self.eval_windows, []
        with self.precision(), torch.no_grad():
            for start in range(0, len(held_out), self.batch_size):
                batch = held_out[start:start + self.batch_size].to(self.device)
                stream = models.student_prefix(input_ids=batch).last_hidden_state
                target = models.teacher_prefix(input_ids=batch).last_hidden_state
                errors.append(relative_error(stream, target).item() * len(batch))
            measured = {"val_relative_error": sum(errors) / len(held_out)}
            if self.perplexity:
                packed = evaluate_perplexity(models.student_model, held_out, self.batch_size, self.progress)
                measured.update(val_loss=packed["loss"], val_ppl=packed["perplexity"], val_doc_ppl=evaluate_documents(
                    models.student_model, self.tokenizer, self.documents, self.seq_len, self.batch_size,
                    self.eval_tokens, self.progress)["token_perplexity"])
        return measured

    def fit(self, before: dict, path: Path) -> dict:
        """The training loop: a line of ``path`` per step (``before``'s first), validated after each
        ``eval_at`` token count and at the last step. Returns the last line."""
        layers = self.models.student_prefix.layers
        parameters = list(layers.parameters())
        # No weight decay: it would pull the pretrained weights toward 0, away from the teacher. Every
        # trained block is a Post-LN block, so --lr is their learning rate.
        optimizer = adamw(parameter_groups(layers, [], lr=self.lr, weight_decay=0.0), betas=HEAL_BETAS)
        scheduler = warmup_cosine(optimizer, round(self.warmup_ratio * self.steps), self.steps)
        guard = StepGuard(self.spike_factor)
        batches = torch.utils.data.DataLoader(
            PackedWindows(self.train_windows, self.steps * self.batch_size, self.seed), batch_size=self.batch_size)
        pending, losses = sorted(self.eval_at), []
        with open(path, "w") as log:
            log.write(json.dumps({"step": 0, "tokens": 0, **before}) + "\n")
            bar = tqdm(batches, total=self.steps, desc="healing", unit="step", disable=not self.progress)
            for step, batch in enumerate(bar, 1):
                with self.precision(), _recomputing(self.objective.runs_through.layers, self.activation_checkpointing):
                    value = self.objective(batch.to(self.device))
                value.backward()  # a checkpointed block's recompute restores the forward's autocast state
                try:
                    taken = take_step(optimizer, scheduler, guard, step=step, loss=value.item(),
                                      clip=lambda: clip_gradients(parameters, self.grad_clip),
                                      block_norms=lambda: (block_grad_norms(layers), layers),
                                      samples=range((step - 1) * self.batch_size, step * self.batch_size))
                except NonFiniteStep as e:
                    raise MixLNError(f"--lr: the heal's {self.loss} {e}; the heal diverged at lr {self.lr:g}: try a "
                                     "smaller --lr") from None
                record = {"step": step, "tokens": step * batch.numel(), **taken,
                          "seconds": round(time.time() - self.started, 2)}
                if (pending and record["tokens"] >= pending[0]) or step == self.steps:
                    pending = [t for t in pending if t > record["tokens"]]
                    record.update(self.validate())
                    check_record_finite(record, self.lr)
                log.write(json.dumps(record) + "\n")
                losses.append(record["loss"])
                bar.set_postfix(loss=f"{record['loss']:.4f}")
        warn_if_worse(losses, before.get("val_ppl"), record.get("val_ppl"), self.lr, before.get("val_doc_ppl"),
                      record.get("val_doc_ppl"))
        return record

    def summary(self, before: dict, after: dict) -> HealResult:
        """:func:`heal`'s result (and the provenance's record), from the figures ``before`` and ``after``."""
        def compared(key: str, teacher: str):
            return {"teacher": self.teacher_figures[teacher], "before": before[key], "after": after[key]}

        return HealResult(
            out=str(self.out), post_ln_layers=self.post_ln_layers, steps=self.steps, tokens=after["tokens"],
            loss=self.loss, lr=self.lr, dtype=self.dtype, activation_checkpointing=self.activation_checkpointing,
            relative_error={"before": before["val_relative_error"], "after": after["val_relative_error"]},
            perplexity=compared("val_ppl", "packed") if self.perplexity else None,
            per_document_perplexity=compared("val_doc_ppl", "per_document") if self.perplexity else None,
            evaluation={"data": str(self.eval_data) if self.eval_data else EVAL_DATA,
                        "tokens": self.eval_windows[:, 1:].numel(), "seq_len": self.seq_len},
            seconds=round(time.time() - self.started, 2),
        )

    def save(self, folder: Path, result: HealResult) -> None:
        """The converted checkpoint into ``folder``, its Post-LN blocks the healed ones, ``result``
        in its provenance."""
        source, arch = self.student_source, self.student_source.arch
        state = self.models.student_prefix.state_dict()
        healed = {name: state[name.removeprefix(arch.decoder + ".")]
                  for name in prefix_names(source, arch, self.post_ln_layers)
                  if arch.layer_of(name) is not None}
        # Only the healed blocks are needed from here: the writer holds an output shard's tensors at once,
        # which on top of both models and the AdamW state would set the peak.
        del state
        self.models = self.objective = None
        record = tool_stamp(teacher=str(Path(self.teacher).absolute()), data=_describe(self.data), seq_len=self.seq_len,
                            batch_size=self.batch_size, **result.record())
        config = dict(source.config)
        config["mixln_provenance"] = {**(config.get("mixln_provenance") or {}), "heal": record}
        write_checkpoint(folder, _healed_tensors(source, healed), config, source, self.max_shard_bytes,
                         desc="writing", total=len(source.names()), progress=self.progress)


@contextlib.contextmanager
def _recomputing(layers, enabled: bool):
    """Around a training forward: the blocks ``layers`` in training mode, the one state in which
    transformers checkpoints them. The blocks alone are switched, not their submodules, so attention
    stays in eval mode (no dropout: a heal distils, it does not regularize), and the evaluations
    between steps find them unchanged."""
    for layer in layers if enabled else ():
        layer.training = True
    try:
        yield
    finally:
        for layer in layers if enabled else ():
            layer.training = False


def _describe(data) -> str:
    if isinstance(data, (np.ndarray, TokenShards)):
        return f"a stream of {len(data)} tokens given"
    if isinstance(data, list):
        return f"{len(data)} documents given"
    return str(data) if data else "embedded:train"


def _healed_tensors(source, healed: dict):
    """Every tensor of ``source``, those named in ``healed`` replaced (in the source's dtype)."""
    for name in source.names():
        stored = source.stored(name)  # an unhealed one is copied file to file
        yield name, healed[name].detach().to("cpu", stored.tensor.dtype) if name in healed else stored
