"""One heal, in the training loop's order: check -> setup -> fit (validating as it goes) -> save.

Every process of an ``accelerate launch`` (or torchrun) heals: each runs an equal share of every step's
windows and the Post-LN blocks' gradients are averaged over the processes before the update, so the
result does not depend on how many there are. Validation is measured by each process on the same
windows (a heal's evaluations are small), and the main process alone writes.
"""

import contextlib
import dataclasses
import hashlib
import shutil
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, Field, dataclass, fields
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ..data import PackedWindows, TokenShards, data_fingerprint, open_tokens, read_texts, token_stream, token_windows, windows
from ..data.shards import is_tokens_folder
from ..errors import MixLNError, warn
from ..evaluation.options import EVAL_DATA
from ..evaluation.perplexity import evaluate_documents, evaluate_perplexity
from ..io.atomic import atomic_output_dir
from ..io.lineage import history
from ..io.paths import check_destination, check_readable, checkpoint_path
from ..io.records import MetricRecord
from ..io.writer import tool_stamp, write_checkpoint
from ..model.modeling_mixln import enable_checkpointing
from ..options import OUT
from ..runtime import map_large_allocations
from ..schema import check_windows, declared, flag
from ..surgery.prefix import prefix_names
from ..training.loop import (NonFiniteStep, StepGuard, adamw, block_grad_norms, clip_gradients, parameter_groups,
                             take_step, warmup_cosine)
from ..training.sharding import shard, sharded_state_dict
from .losses import KL, distillation_loss, relative_error
from .metrics import TeacherFigures, cached_teacher_metrics, check_record_finite, digest, warn_if_worse
from .options import HEAL_BETAS, HealCommand, HealOptions
from .pair import load_models, open_pair, same_tokenizer
from .result import Figures, HealResult, Windows
from .state import METRICS, HealState, Saved


def heal(converted, teacher, out, options: HealOptions | None = None, **settings) -> HealResult:
    """Heal the Mix-LN checkpoint ``converted`` against its Pre-LN original ``teacher``; write ``out``.
    ``options``: a :class:`~mixln_convert.healing.options.HealOptions`; ``settings``: :class:`HealRun`'s
    keyword fields (with ``options``, those replaced). Returns :meth:`HealRun.summary`."""
    given = {f.name: getattr(options, f.name) for f in fields(options)} if options is not None else {}
    return HealRun(converted, teacher, out, **{**given, **settings}).run()


@dataclass
class HealRun(HealOptions):
    """A heal of ``converted``'s Post-LN blocks against ``teacher``, written to ``out``, with the
    :class:`~mixln_convert.healing.options.HealOptions` (``data`` also a list of documents or a 1-D token stream).
    ``activation_checkpointing``: keep only each block's input through a training step and recompute
    the rest in the backward (one more forward, for activations that no longer grow with the depth: see
    :func:`_recomputing`), and with the ``kl`` loss the logits too (:class:`.losses.ChunkedKL`).
    ``named``: how errors name the settings (a flag; train's recipe keys, ``heal.lr``; None: the caller fixed them);
    ``checked``: the caller checked the budget and the windows where they entered (train, convert, sweep).
    ``resume``: continue the heal a kill interrupted (:mod:`.state`).
    """

    converted: str | Path
    teacher: str | Path
    out: str | Path
    _: KW_ONLY  # the options (HealOptions' too), keyword-only as heal() takes them
    force: bool = False
    resume: bool = False
    progress: bool = True
    named: Callable[[Field], str] | None = flag
    checked: bool = False

    def run(self) -> HealResult:
        map_large_allocations()
        inputs = self.check()
        main = self.process.is_main_process
        with atomic_output_dir(self.out, force=self.force, protect=inputs) if main else contextlib.nullcontext() as tmp:
            try:
                self.read_data()
                self.record = self.settings() if main else None
                self.resumed = _agreed(lambda: self.state.check(self.record, self.resume, self.force, self.out, inputs))
                self.setup()
                after = self.fit()
                result = self.summary(self.before, after)
                self.save(tmp, result)
            except BaseException:
                # before its first checkpoint there is nothing to resume: a refusal leaves nothing behind (removed
                # here, while the output is held, so that the folders made above it can go too)
                if main:
                    self.state.remove(finished=False)
                raise
        if main:
            self.state.remove(finished=True)  # the healed checkpoint is in place: nothing is left to resume
        self.process.wait_for_everyone()  # every process finds the output once heal() returns
        if self.owns_group:
            self.process.destroy_process_group()
        return result

    def check(self) -> dict:
        """Every check that needs no model (the numbers were checked when the run was made), before
        anything is written, and the pair opened; returns the inputs the output must not replace."""
        from accelerate import PartialState
        from accelerate.utils import parse_flag_from_env

        self.owns_group = not torch.distributed.is_initialized()  # train's run has its own group
        # accelerate launch --cpu sets ACCELERATE_USE_CPU, which PartialState does not read itself
        self.process = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))
        self.owns_group = self.owns_group and torch.distributed.is_initialized()
        self.steps = self.tokens // (self.batch_size * self.seq_len)
        world = self.process.num_processes
        if self.batch_size % world:
            raise MixLNError(f"{self._name('batch_size')}: {self.batch_size} windows a step do not share equally "
                             f"among {world} processes; give a multiple of {world}")
        fsdp = "fsdp: true" if self._name("fsdp") != self.flag("fsdp") else self.flag("fsdp")  # the recipe's: its own
        if self.fsdp and self.loss != "kl":
            raise MixLNError(f"{fsdp}: shards the whole models the kl loss runs; {self._name('loss')} {self.loss} "
                             "runs the first blocks only, which fit where the whole model does: heal without it")
        if self.fsdp and world < 2:
            raise MixLNError(f"{fsdp}: shards over several processes, and this heal has one; launch it with "
                             "accelerate launch (or torchrun)")
        self.converted = checkpoint_path(self.converted, "CONVERTED")
        teacher, data, eval_data = HealCommand.flag("teacher"), self.flag("data"), self.flag("eval_data")
        self.teacher = checkpoint_path(self.teacher, teacher)
        in_hand = isinstance(self.data, (list, np.ndarray, TokenShards))  # documents or a token stream, not a path
        inputs = {"CONVERTED": self.converted, teacher: self.teacher, data: None if in_hand else self.data,
                  eval_data: self.eval_data}
        for name in (data, eval_data):
            check_readable(inputs[name], name)
        check_destination(self.out, inputs, self.force, flag=OUT)
        self.student_source, self.teacher_source = open_pair(self.converted, self.teacher)
        history(self.student_source.config, where=self.student_source.where)  # what the card reads, checked now
        if not self.checked:
            check_windows(self, self.student_source.config, self.named)
        self.tokenizer = same_tokenizer(self.student_source, self.teacher_source)
        self.post_ln_layers = self.student_source.config["post_ln_layers"]
        self.device = self.process.device
        self.state = HealState(self.out)
        return inputs

    def check_one_step(self, name=flag) -> None:
        if not self.checked:  # else checked where the caller's budget entered, against this step
            super().check_one_step(name)

    def _name(self, key: str) -> str:
        return (self.named or flag)(declared(HealOptions)[key][0])

    def read_data(self) -> None:
        """The training windows (text is tokenized into the user cache; a tokenized folder is read as it is,
        memory-mapped) and the held-out windows and documents; warns when the heal passes over the data
        more than once."""
        if isinstance(self.data, (np.ndarray, TokenShards)):
            stream = self.data
        elif is_tokens_folder(self.data):
            stream = open_tokens(self.data, self.tokenizer)[0]
        else:
            texts = self.data if isinstance(self.data, list) else read_texts(self.data, split="train")
            stream = token_stream(self.tokenizer, texts, self.tokens, _describe(self.data))
        self.train_windows = windows(stream, self.seq_len, _describe(self.data), self.named and self._name("seq_len"))
        self.passes = self.steps * self.batch_size / len(self.train_windows)
        if self.passes > 1 and self.process.is_main_process:
            warn(f"{_describe(self.data)}: holds {len(self.train_windows):,} windows of {self.seq_len} tokens; a heal "
                 f"of {self.tokens:,} tokens passes over them {self.passes:.3g} times")
        if is_tokens_folder(self.eval_data):
            held_out = open_tokens(self.eval_data, self.tokenizer)[1]
            held_out = np.asarray(held_out[: max(1, self.eval_tokens // self.seq_len) * self.seq_len])
            self.documents = _documents(held_out, self.tokenizer)
            self.eval_windows = torch.from_numpy(windows(held_out, self.seq_len, str(self.eval_data),
                                                         self.named and self._name("seq_len")).astype(np.int64))
        else:
            self.documents = read_texts(self.eval_data, split="validation")  # scored packed, and one by one
            self.eval_windows = token_windows(self.tokenizer, self.documents, self.seq_len, self.eval_tokens,
                                              source=self.eval_data or EVAL_DATA)

    def settings(self) -> dict:
        """What a resumed heal must find unchanged: the pair, the data and every setting of the result."""
        data = self.data if isinstance(self.data, str) or self.data is None else None
        stream = None if data is not None or self.data is None else _stream_digest(self.train_windows)
        return {"converted": self.student_source.fingerprint(), "teacher": self.teacher_source.fingerprint(),
                "data": data_fingerprint(data) if data else stream or "embedded:train",
                "eval_windows": digest(self.eval_windows.numpy().tobytes()),
                **{f.name: getattr(self, f.name) for f in fields(HealOptions)
                   if f.name not in ("data", "eval_data", "max_shard_size", "checkpoint_interval")}}

    def setup(self) -> None:
        """The models, the loss, the teacher's figures, and the student's as they stand (or as a resumed
        heal measured them)."""
        self.started = time.time()
        # sharded models are entered through their roots only: no chunked logits from the decoder's output
        loss_class = KL if self.fsdp else distillation_loss(self.loss, self.activation_checkpointing)
        self.models = load_models(self.student_source, self.teacher_source, self.post_ln_layers,
                                  {"fp32": torch.float32, "bf16": torch.bfloat16}[self.dtype], self.device,
                                  whole=self.perplexity or loss_class.whole_models, share=not self.fsdp)
        self.objective = loss_class(self.models)
        if self.activation_checkpointing:
            # non-reentrant: the first block's input (the frozen embeddings' output) needs no gradient
            enable_checkpointing(self.objective.runs_through, {"use_reentrant": False})
        if self.fsdp:  # the trainer's units: a block each, the rest in the root; two roots, nothing shared
            for model in (self.models.student_model, self.models.teacher_model):
                shard(model, bf16=self.dtype == "bf16")
        if self.models.unshared and self.process.is_main_process:
            warn(f"{HealCommand.flag('teacher')} {self.teacher}: {len(self.models.unshared)} tensors outside the first "
                 f"{self.post_ln_layers} blocks differ from {self.converted}'s (the first: {self.models.unshared[0]}); "
                 "the teacher keeps its own copies of those")
        self.teacher_figures = self.measure_teacher() if self.perplexity else None
        if self.resumed:
            self.before = self.state.records()[0]
        else:
            self.before = self.validate()
            if self.process.is_main_process:
                self.state.start(self.record, self.before)

    def precision(self):
        """bf16 compute over bf16 frozen weights (autocast; the trained blocks stay float32 masters)."""
        return torch.autocast(self.device.type, torch.bfloat16) if self.dtype == "bf16" else contextlib.nullcontext()

    def measure_teacher(self) -> TeacherFigures:
        """The teacher's perplexity, packed and per document: it does not change, so it is measured
        once and kept for the next heal against it."""
        def measure() -> TeacherFigures:
            teacher = self.models.teacher_model
            with self.precision():
                packed = evaluate_perplexity(teacher, self.eval_windows, self.batch_size, self.progress)
                documents = evaluate_documents(teacher, self.tokenizer, self.documents, self.seq_len, self.batch_size,
                                               self.eval_tokens, self.progress)
            return TeacherFigures(packed.perplexity, documents.token_perplexity)

        return cached_teacher_metrics(
            measure, teacher=self.teacher_source.fingerprint(), windows=digest(self.eval_windows.numpy().tobytes()),
            documents=digest("\0".join(self.documents).encode()), seq_len=self.seq_len, eval_tokens=self.eval_tokens,
            batch_size=self.batch_size, dtype=self.dtype, device=self.device.type, torch=torch.__version__)

    def validate(self, record: MetricRecord = MetricRecord(step=0, tokens=0)) -> MetricRecord:
        """``record`` with the student's held-out figures as they stand: ``val_relative_error`` of its prefix's
        stream; with ``perplexity`` ``val_loss``, ``val_ppl`` (packed windows) and ``val_doc_ppl`` (per document)."""
        models, held_out, errors = self.models, self.eval_windows, []
        with self.precision(), torch.no_grad():
            for start in range(0, len(held_out), self.batch_size):
                batch = held_out[start:start + self.batch_size].to(self.device)
                errors.append(relative_error(*self.streams(batch)).item() * len(batch))
            record = dataclasses.replace(record, val_relative_error=sum(errors) / len(held_out))
            if self.perplexity:
                packed = evaluate_perplexity(models.student_model, held_out, self.batch_size, self.progress)
                record = dataclasses.replace(record, val_loss=packed.loss, val_ppl=packed.perplexity, val_doc_ppl=(
                    evaluate_documents(models.student_model, self.tokenizer, self.documents, self.seq_len,
                                       self.batch_size, self.eval_tokens, self.progress).token_perplexity))
        return record

    def streams(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The student's and the teacher's residual streams as their Post-LN blocks hand them on: the prefixes'
        outputs, or (sharded) the whole models' hidden states there."""
        models = self.models
        if not self.fsdp:
            return (models.student_prefix(input_ids=batch).last_hidden_state,
                    models.teacher_prefix(input_ids=batch).last_hidden_state)
        return tuple(model(input_ids=batch, output_hidden_states=True).hidden_states[self.post_ln_layers]
                     for model in (models.student_model, models.teacher_model))

    def trained_state(self, optimizer) -> tuple[dict, dict]:
        """The Post-LN blocks' weights and AdamW's state, whole (sharded: gathered onto the main process, which
        alone gets them; every process calls it)."""
        if not self.fsdp:
            return self.models.student_prefix.layers.state_dict(), optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        model = self.models.student_model
        weights, state = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True,
                                                                                   cpu_offload=True))
        trained = {name for name, p in model.named_parameters() if p.requires_grad}
        return {name: tensor for name, tensor in weights.items() if name in trained}, state

    def load_trained_state(self, optimizer, weights: dict, state: dict) -> None:
        if not self.fsdp:
            self.models.student_prefix.layers.load_state_dict(weights)
            optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(self.models.student_model, optimizer, model_state_dict=weights, optim_state_dict=state,
                       options=StateDictOptions(full_state_dict=True, strict=False))

    def fit(self) -> MetricRecord:
        """The training loop: a line of the metrics per step (the figures before it first), validated after
        each ``eval_at`` token count and at the last step, checkpointed every ``checkpoint_interval``
        steps; from the last checkpoint when resumed. Returns the last line."""
        layers = self.models.student_prefix.layers
        parameters = list(layers.parameters())
        # No weight decay: it would pull the pretrained weights toward 0, away from the teacher. Every
        # trained block is a Post-LN block, so --lr is their learning rate.
        optimizer = adamw(parameter_groups(layers, [], lr=self.lr, weight_decay=0.0), betas=HEAL_BETAS)
        scheduler = warmup_cosine(optimizer, round(self.warmup_ratio * self.steps), self.steps)
        guard = StepGuard(self.spike_factor)
        start, spent = 0, 0.0
        if self.resumed:
            saved = self.state.load(self.process.is_main_process)
            self.load_trained_state(optimizer, saved.blocks, saved.optimizer)
            scheduler.load_state_dict(saved.scheduler)
            guard.load_state_dict(saved.guard)
            torch.set_rng_state(saved.rng)
            start, spent = saved.step, saved.seconds
        self.started = time.time() - spent
        samples = PackedWindows(self.train_windows, self.steps * self.batch_size, self.seed)
        world, rank, main = self.process.num_processes, self.process.process_index, self.process.is_main_process
        share = self.batch_size // world  # this process's windows of each step
        record = self.before
        losses = [r.loss for r in self.state.records()[1:]] if self.resumed else []
        pending = sorted(t for t in self.eval_at if t > start * self.batch_size * self.seq_len)
        bar = tqdm(range(start + 1, self.steps + 1), initial=start, total=self.steps, desc="healing", unit="step",
                   disable=not (self.progress and main))
        for step in bar:
            first = (step - 1) * self.batch_size + rank * share
            batch = torch.stack([samples[i] for i in range(first, first + share)])
            with self.precision(), _recomputing(self.objective.runs_through.layers, self.activation_checkpointing):
                value = self.objective(batch.to(self.device))
            value.backward()  # a checkpointed block's recompute restores the forward's autocast state
            loss = _averaged(value.detach(), [] if self.fsdp else parameters, world)  # FSDP averages its own
            try:
                record = take_step(optimizer, scheduler, guard,
                                   MetricRecord(step=step, tokens=step * self.batch_size * self.seq_len), loss=loss,
                                   clip=lambda: clip_gradients(parameters, self.grad_clip),
                                   block_norms=lambda: (block_grad_norms(layers, _summed if self.fsdp else None),
                                                        layers),
                                   samples=range((step - 1) * self.batch_size, step * self.batch_size))
            except NonFiniteStep as e:
                raise MixLNError(f"{self._name('lr')}: the heal's {self.loss} {e}; the heal diverged at lr "
                                 f"{self.lr:g}: try a smaller {self._name('lr')}") from None
            record = dataclasses.replace(record, seconds=round(time.time() - self.started, 2))
            if (pending and record.tokens >= pending[0]) or step == self.steps:
                pending = [t for t in pending if t > record.tokens]
                record = self.validate(record)
                check_record_finite(record, self.lr, self._name)
            losses.append(record.loss)
            bar.set_postfix(loss=f"{record.loss:.4f}")
            if main:
                self.state.log(record)
            if self.checkpoint_interval and step % self.checkpoint_interval == 0 and step < self.steps:
                weights, state = self.trained_state(optimizer)
                if main:
                    self.state.save(Saved(step, record.seconds, weights, state, scheduler.state_dict(),
                                          guard.state_dict(), torch.get_rng_state()))
        if main:
            warn_if_worse(losses, self.before.val_ppl, record.val_ppl, self.lr, self.before.val_doc_ppl,
                          record.val_doc_ppl, self._name)
        return record

    def summary(self, before: MetricRecord, after: MetricRecord) -> HealResult:
        """:func:`heal`'s result (and the provenance's record), from the figures ``before`` and ``after``."""
        def compared(key: str, teacher: str):
            return Figures(before=getattr(before, key), after=getattr(after, key),
                           teacher=getattr(self.teacher_figures, teacher))

        return HealResult(
            out=str(self.out), post_ln_layers=self.post_ln_layers, steps=self.steps, tokens=after.tokens,
            loss=self.loss, lr=self.lr, dtype=self.dtype, activation_checkpointing=self.activation_checkpointing,
            relative_error=Figures(before=before.val_relative_error, after=after.val_relative_error),
            perplexity=compared("val_ppl", "packed") if self.perplexity else None,
            per_document_perplexity=compared("val_doc_ppl", "per_document") if self.perplexity else None,
            evaluation=Windows(data=str(self.eval_data) if self.eval_data else EVAL_DATA,
                               tokens=self.eval_windows[:, 1:].numel(), seq_len=self.seq_len),
            data_passes=round(self.passes, 4), processes=self.process.num_processes,
            seconds=round(time.time() - self.started, 2))

    def save(self, folder: Path | None, result: HealResult) -> None:
        """The converted checkpoint into ``folder`` (None: another process writes it), its Post-LN blocks the
        healed ones, ``result`` in its provenance, the heal's metrics beside it."""
        source, arch = self.student_source, self.student_source.arch
        if self.fsdp:  # gathered onto the main process: every process takes part
            state, prefix = sharded_state_dict(self.models.student_model), ""
        else:
            state, prefix = self.models.student_prefix.state_dict(), arch.decoder + "."
        healed = {name: state[name.removeprefix(prefix)] for name in prefix_names(source, arch, self.post_ln_layers)
                  if arch.layer_of(name) is not None and folder is not None}
        # Only the healed blocks are needed from here: the writer holds an output shard's tensors at once,
        # which on top of both models and the AdamW state would set the peak.
        del state
        self.models = self.objective = None
        if folder is None:
            return
        record = tool_stamp(teacher=str(Path(self.teacher).absolute()), data=_describe(self.data), seq_len=self.seq_len,
                            batch_size=self.batch_size, **result.record())
        config = dict(source.config)
        config["mixln_provenance"] = {**(config.get("mixln_provenance") or {}), "heal": record}
        write_checkpoint(folder, _healed_tensors(source, healed), config, source, self.max_shard_bytes,
                         desc="writing", total=len(source.names()), progress=self.progress)
        shutil.copyfile(self.state.folder / METRICS, folder / METRICS)


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


def _documents(stream: np.ndarray, tokenizer) -> list[str]:
    """The documents of a tokenized stream (EOS between them) as text, for the per-document evaluation."""
    cuts = np.flatnonzero(stream == tokenizer.eos_token_id)
    return [text for piece in np.split(stream, cuts) if (text := tokenizer.decode(piece[piece != tokenizer.eos_token_id]
                                                                                      ).strip())]


def _stream_digest(train_windows) -> str:
    """sha256 of every training window (a stream given in hand: a resumed heal must find the same)."""
    found = hashlib.sha256()
    for start in range(0, len(train_windows), 4096):
        found.update(np.ascontiguousarray(np.stack([train_windows[j] for j in range(start, min(
            start + 4096, len(train_windows)))])).astype("<i4").tobytes())
    return found.hexdigest()


def _averaged(loss: torch.Tensor, parameters, world: int) -> float:
    """The step's loss, and the gradients of ``parameters``, averaged over the ``world`` processes (each
    computed them on an equal share of the step's windows)."""
    if world > 1:
        for p in parameters:
            if p.grad is not None:
                torch.distributed.all_reduce(p.grad)
                p.grad.div_(world)
        torch.distributed.all_reduce(loss)
        loss = loss / world
    return loss.item()


def _summed(tensor: torch.Tensor) -> torch.Tensor:
    torch.distributed.all_reduce(tensor)
    return tensor


def _agreed(decide):
    """``decide()`` as the main process answers it, on every process: its value, or its refusal raised everywhere
    (the others would otherwise wait for a step the main process never takes)."""
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    state = PartialState()
    answer = [None]
    if state.is_main_process:
        try:
            answer = [("value", decide())]
        except MixLNError as e:
            answer = [("error", str(e))]
    if state.num_processes > 1:
        broadcast_object_list(answer)
    kind, value = answer[0]
    if kind == "error":
        raise MixLNError(value)
    return value


def _healed_tensors(source, healed: dict):
    """Every tensor of ``source``, those named in ``healed`` replaced (in the source's dtype)."""
    for name in source.names():
        stored = source.stored(name)  # an unhealed one is copied file to file
        yield name, healed[name].detach().to("cpu", stored.tensor.dtype) if name in healed else stored
