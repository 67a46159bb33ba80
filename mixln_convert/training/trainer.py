"""The continued pre-training loop on accelerate: one CPU process, one GPU, DDP or FSDP run the
same code (``accelerate launch`` chooses). It trains one prepared source (a checkpoint folder
or .gguf) on a token stream; :mod:`mixln_convert.workflows.train` prepares and chains the arms.

Output per arm folder: ``metrics.jsonl``, ``checkpoints/step-N/`` (accelerate state: model,
optimizer, scheduler, RNG), ``final/`` (a from_pretrained folder with tokenizer) and ``summary.json``.
"""

import json
import math
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.tracking import TensorBoardTracker
from accelerate.utils import broadcast_object_list, set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from ..architectures import model_blocks
from ..data import PackedWindows, Splits, windows
from ..data.shards import file_sha256
from ..errors import MixLNError, first_line, warn
from ..evaluation.options import EVAL_DATA, Measured
from ..evaluation.perplexity import evaluate_perplexity
from ..io.atomic import atomic_output_dir, write_atomic
from ..io.lineage import add_record
from ..io.model_card import write_card
from ..io.records import METRICS, MetricRecord, Record, append_metrics, cut_metrics
from ..io.writer import copy_model_code, tool_stamp
from ..model.modeling_mixln import enable_checkpointing
from ..schema import Count, String, read_record, setting
from ..surgery.loading import load_model
from .loop import StepGuard, adamw, block_grad_norms, clip_gradients, parameter_groups, take_step, warmup_cosine
from .recipe import Recipe
from .summary import TrainSummary
from .sharding import is_sharded, load_sharded, save_sharded, shard, sharded_state_dict


@dataclass
class Run:
    """What :func:`setup` prepares for one arm: the prepared model, optimizer, schedule and data."""

    accelerator: Accelerator
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    loader: DataLoader
    validation: np.ndarray  # [m, seq_len] validation windows
    steps: int
    step_tokens: int
    accumulation: int
    parameters: int
    guard: StepGuard
    global_batch_size: int

    @property
    def sharded(self) -> bool:
        return is_sharded(self.model)

    @property
    def layers(self):
        return model_blocks(self.accelerator.unwrap_model(self.model))

    @property
    def config(self):
        return self.accelerator.unwrap_model(self.model).config

    def block_norms(self) -> list[float]:
        """Each block's gradient norm; a sharded gradient's squares are summed over the processes."""
        return block_grad_norms(self.layers, (lambda x: self.accelerator.reduce(x, "sum")) if self.sharded else None)


def train_arm(recipe: Recipe, arm: str, folder: Path, source: str, splits: Splits, tokenizer, accumulation: int,
              resume: bool = False, progress: bool = True) -> TrainSummary:
    """Train ``source`` as arm ``arm`` into ``folder``; returns the arm's summary. With ``resume``
    it continues from the last checkpoint that loads."""
    started = time.time()
    folder.mkdir(parents=True, exist_ok=True)
    if torch.cuda.is_available():  # the arm's own peak, not an earlier arm's or the heal's
        torch.cuda.reset_peak_memory_stats()
    run = setup(recipe, folder, source, splits, accumulation)
    initial = validate(run, recipe.micro_batch_size)
    start = _restore(run, folder) if resume else 0
    record, train_time = fit(run, recipe, arm, folder, start, progress)
    validation = Measured(data=validation_source(recipe.data),
                          tokens=len(initial.val_window_losses) * (recipe.seq_len - 1), seq_len=recipe.seq_len)
    # final/config.json records the training (as prune records a pruning), so an export of it keeps it
    trained = tool_stamp(source=str(source), arm=arm, steps=run.steps, tokens=run.steps * run.step_tokens,
                         data=str(recipe.data.train or "embedded:train"), precision=run.accelerator.mixed_precision,
                         initial_val_ppl=initial.val_ppl, final_val_ppl=record.val_ppl, validation=validation.to_dict(),
                         recipe=recipe.to_dict())
    save(run, tokenizer, folder, trained)
    summary = TrainSummary(
        arm=arm, source=source, steps=run.steps, tokens=run.steps * run.step_tokens,
        wall_time_s=round(time.time() - started, 2), resumed_from_step=start,
        final_val_loss=record.val_loss, final_val_ppl=record.val_ppl,
        initial_val_loss=initial.val_loss, initial_val_ppl=initial.val_ppl, validation=validation,
        initial_val_window_losses=initial.val_window_losses, final_val_window_losses=record.val_window_losses,
        tokens_per_s=(run.steps - start) * run.step_tokens / train_time, parameters=run.parameters,
        num_layers=run.config.num_hidden_layers, post_ln_layers=getattr(run.config, "post_ln_layers", 0),
        layernorm_scaling=getattr(run.config, "layernorm_scaling", False),
        heal_tokens=recipe.heal.tokens if arm == "mixln" else 0,  # prepare() heals only that arm
        processes=run.accelerator.num_processes, precision=run.accelerator.mixed_precision,
        attention=recipe.attention,
        peak_gpu_memory_bytes=torch.cuda.max_memory_allocated() if run.accelerator.device.type == "cuda" else None,
    )
    if run.accelerator.is_main_process:  # the card before the summary, which says the arm is done
        write_card(folder / "final", source=source)  # its training as final/config.json records it
        summary.write(folder)
    # not end_training(): it would destroy the process group the next arm needs
    for tracker in run.accelerator.trackers:
        tracker.finish()
    run.accelerator.free_memory()
    return summary


def setup(recipe: Recipe, folder: Path, source: str, splits: Splits, accumulation: int) -> Run:
    """The accelerator, the model (fp32 master weights; bf16 is autocast, or FSDP2's parameter
    dtype), AdamW, the schedule and the seeded data order. Single process and DDP are prepared by
    accelerate; ``fsdp: true`` is sharded by the trainer itself (:mod:`.sharding` says why)."""
    # accelerate keeps one AcceleratorState per process: without a reset, the next arm (or run)
    # would inherit this one's precision and plugins. The process group (PartialState) stays.
    AcceleratorState._reset_state(reset_partial_state=False)
    accelerator = Accelerator(
        mixed_precision=mixed_precision(recipe.precision),
        gradient_accumulation_steps=accumulation,
        # accelerate would step the scheduler once per process; ours counts optimizer steps
        step_scheduler_with_optimizer=False,
        log_with=trackers(recipe, folder) or None,
        project_dir=folder,
    )
    accelerator.init_trackers(folder.parent.name, config=tracked_config(recipe),
                              init_kwargs={"wandb": {"name": folder.name}, "mlflow": {"run_name": folder.name}})
    set_seed(recipe.seed)
    model = load_model(source, dtype=torch.float32).train()
    model.set_attn_implementation(recipe.attention)
    parameters = sum(p.numel() for p in model.parameters())
    if recipe.activation_checkpointing:
        enable_checkpointing(model, {"use_reentrant": False})
    if recipe.fsdp:
        shard(model.to(accelerator.device), bf16=accelerator.mixed_precision == "bf16")
    if recipe.compile:
        for layer in model_blocks(model):  # per block: the state dict keeps its names, a recompile is per shape
            layer.compile()
    inside = {id(p) for p in model_blocks(model).parameters()}
    outside = [p for p in model.parameters() if id(p) not in inside]
    optim = recipe.optim
    optimizer = adamw(parameter_groups(model_blocks(model), outside, lr=optim.lr, weight_decay=optim.weight_decay,
                                       post_ln_lr_scale=optim.post_ln_lr_scale), betas=optim.betas, eps=optim.eps)
    scheduler = warmup_cosine(optimizer, recipe.schedule.warmup_steps, recipe.steps, recipe.schedule.min_lr_ratio)
    train_windows, validation = split_windows(recipe, splits)
    data = PackedWindows(train_windows, recipe.steps * recipe.global_batch_size, recipe.seed)
    passes = len(data) / max(len(train_windows), 1)
    if passes > 1 and accelerator.is_main_process:  # said once per arm, before the first step
        warn(f"data.train: {len(train_windows):,} windows of {recipe.seq_len} tokens for {len(data):,} "
             f"(max_tokens {recipe.max_tokens:,}): the run repeats the training text {passes:.1f} times; more text or "
             "a smaller max_tokens trains on each token once")
    loader = DataLoader(data, batch_size=recipe.micro_batch_size, **loader_options(accelerator.device))
    if recipe.fsdp:
        loader = accelerator.prepare(loader)
    else:
        model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    return Run(accelerator, model, optimizer, scheduler, loader, validation, recipe.steps,
               recipe.global_batch_size * recipe.seq_len, accumulation, parameters, StepGuard(**asdict(recipe.guard)),
               recipe.global_batch_size)


def trackers(recipe: Recipe, folder: Path) -> list:
    """The recipe's trackers (resolved when it was loaded), each run named after the arm (``folder``'s name; the
    project: the run folder's). TensorBoard's run is its log folder: its tracker logs into ``folder`` itself, so
    ``tensorboard --logdir OUT`` lists one run per arm."""
    return [TensorBoardTracker(folder.name, folder.parent) if name == "tensorboard" else name
            for name in recipe.trackers or ()]


def tracked_config(recipe: Recipe) -> dict:
    """The resolved recipe as trackers store it: {dotted key: bool, number or string}, lists and null as JSON."""
    return {key: value if isinstance(value, (bool, int, float, str)) else json.dumps(value)
            for key, value in recipe.flat().items()}


def loader_options(device: torch.device) -> dict:
    """On a GPU, batches are prepared by two workers into pinned memory while the step runs; on
    CPU the step itself needs the cores."""
    return {"pin_memory": True, "num_workers": 2, "persistent_workers": True} if device.type == "cuda" else {}


def split_windows(recipe: Recipe, splits: Splits):
    """The training and validation streams in windows of ``seq_len``; refuses a split shorter than one window."""
    return (windows(splits.train, recipe.seq_len, recipe.data.train or "embedded:train"),
            windows(splits.validation, recipe.seq_len, validation_source(recipe.data)))


def fit(run: Run, recipe: Recipe, arm: str, folder: Path, start: int, progress: bool) -> tuple[MetricRecord, float]:
    """Optimizer steps ``start + 1 .. run.steps``, logging, validating and checkpointing as the
    recipe says; returns the last step's record and the seconds spent in steps."""
    accelerator = run.accelerator
    main = accelerator.is_main_process
    batches = iter(accelerator.skip_first_batches(run.loader, start * run.accumulation) if start else run.loader)
    record, train_time = None, 0.0
    bar = tqdm(range(start + 1, run.steps + 1), initial=start, total=run.steps, desc=f"train {arm}", unit="step",
               disable=not (progress and main))
    for done in bar:  # `done` optimizer steps once this one is taken
        tick = time.perf_counter()
        loss = torch.zeros((), device=accelerator.device)
        for micro in range(run.accumulation):
            loss += _micro_step(run, next(batches), last=micro == run.accumulation - 1) / run.accumulation
        last = done == run.steps
        norms = run.block_norms() if done % recipe.grad_norm_interval == 0 or last else None
        try:
            record = take_step(run.optimizer, run.scheduler, run.guard,
                               MetricRecord(step=done, tokens=done * run.step_tokens, grad_norm_per_layer=norms),
                               loss=accelerator.reduce(loss, "mean").item(),
                               clip=lambda: clip_gradients(run.model.parameters(), recipe.grad_clip),
                               block_norms=lambda: (norms or run.block_norms(), run.layers),
                               samples=range((done - 1) * run.global_batch_size, done * run.global_batch_size))
        except MixLNError as e:
            found = _checkpoints(folder)
            good = found[-1][1] if found else "none, the run starts from its source"
            raise MixLNError(f"{arm}: {e}; training stopped (last good checkpoint: {good})") from None
        if accelerator.device.type == "cuda":
            torch.cuda.synchronize()  # a step's time is its kernels', not their launches'
        elapsed = time.perf_counter() - tick
        train_time += elapsed
        record = replace(record, tokens_per_s=run.step_tokens / elapsed)
        if done % recipe.eval_interval == 0 or last:
            record = validate(run, recipe.micro_batch_size, record)
        if main and (done % recipe.log_interval == 0 or record.val_loss is not None or norms is not None
                     or record.skipped or last):
            append_metrics(folder / METRICS, record)
            accelerator.log({k: v for k, v in record.to_dict().items() if isinstance(v, (int, float))}, step=done)
        bar.set_postfix(loss=f"{record.loss:.4f}")
        if done % recipe.checkpoint_interval == 0 and not last:
            _save_checkpoint(run, folder, done, recipe.keep_checkpoints)
    return record, train_time


def _micro_step(run: Run, batch: torch.Tensor, last: bool) -> torch.Tensor:
    """Forward (no KV cache: nothing reads it) and backward of one micro-batch; gradients are
    synchronized on the last one only."""
    if run.sharded:
        run.model.set_requires_gradient_sync(last)
        loss = run.model(input_ids=batch, labels=batch, use_cache=False).loss
        (loss / run.accumulation).backward()
    else:
        with run.accelerator.accumulate(run.model):
            loss = run.model(input_ids=batch, labels=batch, use_cache=False).loss
            run.accelerator.backward(loss)
    return loss.detach()


def validate(run: Run, batch_size: int, record: MetricRecord = MetricRecord(step=0, tokens=0)) -> MetricRecord:
    """Validation loss and the loss of each validation window (in window order), from which the
    report bootstraps intervals: each process scores an equal share of the windows (equal, so
    FSDP's collective forwards line up), then the shares are gathered."""
    accelerator, model = run.accelerator, run.model
    world, rank = accelerator.num_processes, accelerator.process_index
    share = run.validation[rank: len(run.validation) - len(run.validation) % world: world]
    model.eval()
    measured = evaluate_perplexity(model, torch.from_numpy(share.astype("int64")), batch_size, progress=False)
    model.train()
    gathered = accelerator.gather(torch.tensor(measured.window_losses, device=accelerator.device))
    window_losses = gathered.view(world, -1).T.flatten().tolist()  # rank r held windows r, r + world, ...
    loss = sum(window_losses) / len(window_losses)
    return replace(record, val_loss=loss, val_ppl=math.exp(loss), val_window_losses=window_losses)


def validation_source(data) -> str:
    """What a recipe's ``data`` section validates on, as reports name it."""
    if data.validation is not None:
        return str(data.validation)
    return EVAL_DATA if data.train is None else f"{data.train} (held-out documents)"


def save(run: Run, tokenizer, folder: Path, trained: dict) -> None:
    """``folder/final``: a from_pretrained folder of the trained model, with its tokenizer; its config.json
    records the training ``trained`` (:func:`~mixln_convert.io.lineage.add_record`)."""
    accelerator = run.accelerator
    # gathers the shards onto the main process
    state_dict = sharded_state_dict(run.model) if run.sharded else accelerator.get_state_dict(run.model)
    if accelerator.is_main_process:
        with atomic_output_dir(folder / "final", force=True) as tmp:
            accelerator.unwrap_model(run.model).save_pretrained(tmp, state_dict=state_dict)
            tokenizer.save_pretrained(tmp)
            add_record(tmp / "config.json", "trained", trained)
            if getattr(run.config, "post_ln_layers", None) is not None:  # Mix-LN: trust_remote_code loading
                copy_model_code(tmp)
    accelerator.wait_for_everyone()


def mixed_precision(precision: str) -> str:
    """accelerate's name for a recipe's ``precision`` (auto: bf16 on a GPU)."""
    return "bf16" if precision == "bf16" or (precision == "auto" and torch.cuda.is_available()) else "no"


CHECKSUMS = "mixln-checksums.json"  # in each checkpoint: every file's size and sha256


def _checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint, by step; other names (a user's copy such as
    step-4.bak, a save in progress) are not checkpoints."""
    return sorted((int(p.name.removeprefix("step-")), p) for p in (folder / "checkpoints").glob("step-*")
                  if p.is_dir() and p.name.removeprefix("step-").isdigit())


def _saved_files(checkpoint: Path) -> dict[str, Path]:
    return {str(f.relative_to(checkpoint)): f for f in sorted(checkpoint.rglob("*"))
            if f.is_file() and f.name != CHECKSUMS}


def _sha256s(files: dict[str, Path]) -> dict[str, str]:
    """Each file's sha256, several files at once: hashlib releases the GIL, so a checkpoint of many
    shards hashes at the disk's pace rather than one core's."""
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        return dict(zip(files, pool.map(file_sha256, files.values())))


@dataclass(frozen=True)
class SavedFile(Record):
    """A checkpoint file as :data:`CHECKSUMS` records it, by its path in the checkpoint."""
    bytes: int = setting(kind=Count(0, 2**63 - 1))
    sha256: str = setting(kind=String())


def _file_digests(checkpoint: Path) -> dict:
    files = _saved_files(checkpoint)
    hashes = _sha256s(files)
    return {name: SavedFile(f.stat().st_size, hashes[name]).to_dict() for name, f in files.items()}


GUARD_STATE = "step_guard.json"  # in each checkpoint: the loss-spike guard's recent losses


def _save_checkpoint(run: Run, folder: Path, step: int, keep: int) -> None:
    accelerator = run.accelerator
    tmp, final = folder / "checkpoints" / f".step-{step}.tmp", folder / "checkpoints" / f"step-{step}"
    if accelerator.is_main_process and tmp.exists():  # left by a run killed while saving
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    if run.sharded:
        save_sharded(run.model, run.optimizer, run.scheduler, tmp, accelerator.is_main_process)
    else:
        accelerator.save_state(tmp)
    if accelerator.is_main_process:
        write_atomic(tmp / GUARD_STATE, json.dumps(run.guard.state_dict()) + "\n")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        # a file damaged in place later (same size, other bytes) is then found before it is loaded
        write_atomic(tmp / CHECKSUMS, json.dumps(_file_digests(tmp), indent=1) + "\n")
        if final.exists():  # a damaged checkpoint the resume skipped
            shutil.rmtree(final)
        tmp.rename(final)  # only complete checkpoints carry a step-N name
        for _, old in _checkpoints(folder)[:-keep] if keep else []:
            shutil.rmtree(old)


def _damage(checkpoint: Path) -> str | None:
    """What is wrong with ``checkpoint``'s files against its recorded checksums, or None."""
    if not (checkpoint / CHECKSUMS).exists():  # saved before checkpoints carried checksums
        warn(f"{checkpoint} has no {CHECKSUMS} (saved by an older version): loading it unverified")
        return None
    try:
        recorded = json.loads((checkpoint / CHECKSUMS).read_text())
        if not isinstance(recorded, dict):
            raise ValueError("not a JSON object")
        recorded = {name: read_record(SavedFile, item, CHECKSUMS, "a file's size and sha256", name)
                    for name, item in recorded.items()}
    except (OSError, ValueError):
        return f"{CHECKSUMS} is unreadable"
    except MixLNError as e:  # an entry that is no size and sha256: one line naming its key
        return str(e)
    found = _saved_files(checkpoint)
    for name in sorted(set(recorded) | set(found)):
        if name not in found:
            return f"{name} is missing"
        if name not in recorded:
            return f"{name} was not saved there"
    # every size before any hash: a truncated file is found without reading gigabytes of the others
    for name, f in found.items():
        if recorded[name].bytes != f.stat().st_size:
            return f"{name} is not the file that was saved"
    for name, sha256 in _sha256s(found).items():
        if recorded[name].sha256 != sha256:
            return f"{name} is not the file that was saved"
    return None


def _restore(run: Run, folder: Path) -> int:
    """Load the last checkpoint whose files are the ones saved (checksums, checked by the main
    process for all) and that loads; a damaged one is skipped with a warning. Drops the metrics
    logged after it; returns its step (0: none)."""
    accelerator = run.accelerator
    step = 0
    for found_step, checkpoint in reversed(_checkpoints(folder)):
        damage = [_damage(checkpoint) if accelerator.is_main_process else None]
        if accelerator.num_processes > 1:
            broadcast_object_list(damage)
        try:
            if damage[0]:
                raise MixLNError(damage[0])
            if run.sharded:
                load_sharded(run.model, run.optimizer, run.scheduler, checkpoint)
            else:
                accelerator.load_state(checkpoint)
            if (checkpoint / GUARD_STATE).is_file():  # saved before the guard was checkpointed: it starts afresh
                run.guard.load_state_dict(json.loads((checkpoint / GUARD_STATE).read_text()), GUARD_STATE)
        except Exception as e:  # torch, safetensors and pickle each fail their own way on a damaged file
            warn(f"{checkpoint} is damaged ({first_line(e)[:200]}); trying the checkpoint before it")
            continue
        step = found_step
        break
    else:
        if _checkpoints(folder):
            raise MixLNError(f"{_checkpoints(folder)[-1][1]}: damaged, and no earlier checkpoint loads; "
                             "remove the arm's checkpoints folder to start it again")
    if accelerator.is_main_process and (folder / METRICS).is_file():
        cut_metrics(folder / METRICS, step)
    accelerator.wait_for_everyone()
    return step

