"""The continued pre-training loop on accelerate: one CPU process, one GPU, DDP or FSDP run the
same code (``accelerate launch`` chooses). The arms train one after the other on the same data
order, budget and hyper-parameters:

- ``mixln``: the source converted to Mix-LN (into ``OUT/mixln/converted`` unless the recipe names
  an already converted checkpoint);
- ``preln``: the unconverted source, the control.

Output per arm (``OUT/<arm>/``): ``metrics.jsonl``, ``checkpoints/step-N/`` (accelerate state:
model, optimizer, scheduler, RNG), ``final/`` (a from_pretrained folder with tokenizer) and
``summary.json``; ``OUT/recipe.yaml`` is the resolved recipe.
"""

import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, is_tensorboard_available, parse_flag_from_env, set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import get_cosine_with_min_lr_schedule_with_warmup

from ..conversion.converter import convert
from ..errors import MixLNError
from ..evaluate import evaluate_perplexity
from ..healing import heal
from ..io.loader import open_checkpoint
from ..io.paths import check_not_input
from ..io.writer import atomic_output_dir, copy_model_code
from ..limits import check_seq_len
from ..model.loading import load_model
from .data import PackedBlocks, Splits, load_splits, split_texts
from .recipe import optimizer_steps

ARMS = ("mixln", "preln")


def train(recipe: dict, out, arms=ARMS, resume: bool = False, progress: bool = True) -> dict:
    """Train each arm of ``arms`` in turn into ``out``; returns {arm: summary}.

    With ``resume`` an interrupted run continues from each arm's last checkpoint (finished arms
    are kept as they are); the recipe must be the one the run started with.
    """
    out = Path(out).absolute()
    # Accelerator reads `accelerate launch --cpu` (ACCELERATE_USE_CPU) itself; PartialState does not.
    state = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))
    accumulation = _accumulation(recipe, state.num_processes)
    source = open_checkpoint(recipe["source"])
    check_seq_len("seq_len", recipe["seq_len"], source.config, recipe["allow_longer_seq"])
    if recipe["heal"]["tokens"]:
        check_seq_len("heal.seq_len", recipe["heal"]["seq_len"], source.config, recipe["allow_longer_seq"])
    _claim(out, recipe, resume, state)
    tokenizer = source.tokenizer
    with state.main_process_first():  # the main process tokenizes into the cache, the others read it
        splits = load_splits(recipe, tokenizer)
    summaries = {arm: _train_arm(recipe, arm, out / arm, splits, tokenizer, accumulation, resume, progress)
                 for arm in arms}
    state.destroy_process_group()
    return summaries


def _accumulation(recipe: dict, processes: int) -> int:
    per_pass = recipe["micro_batch_size"] * processes
    if recipe["global_batch_size"] % per_pass:
        raise MixLNError(f"global_batch_size {recipe['global_batch_size']} is not a multiple of micro_batch_size x "
                         f"processes = {recipe['micro_batch_size']} x {processes}")
    return recipe["global_batch_size"] // per_pass


def _write_atomic(path: Path, text: str) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
        tmp.write(text)
    os.replace(tmp.name, path)


def _claim(out: Path, recipe: dict, resume: bool, state: PartialState) -> None:
    """Refuse to mix two runs in one folder; the main process then writes the resolved recipe."""
    saved = out / "recipe.yaml"
    inputs = {key: recipe[key] for key in ("source", "converted")}
    inputs.update({f"data.{key}": recipe["data"][key] for key in ("train", "validation")})
    check_not_input(out, inputs, "--out")
    if saved.is_file():
        if not resume:
            raise MixLNError(f"{out}: holds a training run already; add --resume to continue it, "
                             "or choose another --out")
        try:
            started_with = yaml.safe_load(saved.read_text())
        except (OSError, ValueError, yaml.YAMLError):
            raise MixLNError(f"{saved}: damaged; it holds the recipe --resume must match") from None
        if started_with != recipe:
            raise MixLNError(f"{out}: --resume needs the recipe the run started with, and {saved} differs")
    elif out.is_dir() and any(out.iterdir()):
        raise MixLNError(f"{out}: exists, is not empty and holds no training run; choose another --out")
    state.wait_for_everyone()  # every process has checked before the main one writes
    if state.is_main_process and not saved.is_file():
        out.mkdir(parents=True, exist_ok=True)
        _write_atomic(saved, yaml.safe_dump(recipe, sort_keys=False))


def _arm_source(recipe: dict, arm: str, folder: Path, progress: bool) -> str:
    """The checkpoint an arm trains from, converting the source for the Mix-LN arm if needed."""
    if arm == "preln":
        return recipe["source"]
    converted = recipe["converted"] or folder / "converted"
    with PartialState().main_process_first():  # the main process converts, the others then find the folder
        if not (Path(converted) / "config.json").is_file():
            convert(recipe["source"], converted, alpha=recipe["conversion"]["alpha"],
                    strategy=recipe["conversion"]["strategy"], seed=recipe["seed"], progress=progress)
        if not recipe["heal"]["tokens"]:
            return str(converted)
        healed = folder / "healed"
        if not (healed / "config.json").is_file():
            # the engine's own training documents: with a user data.train, its validation documents are held out
            heal(converted, recipe["source"], healed, data=split_texts(recipe["data"])[0], perplexity=False,
                 seed=recipe["seed"], progress=progress, **recipe["heal"])
    return str(healed)


def _adamw(model, optim: dict) -> torch.optim.AdamW:
    # No weight decay on the 1-D norm gains: it would pull the calibrated Post-LN gains toward 0.
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": optim["weight_decay"]},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=optim["lr"], betas=tuple(optim["betas"]), eps=optim["eps"])


def _mixed_precision(precision: str) -> str:
    if precision == "auto":
        return "bf16" if torch.cuda.is_available() else "no"
    return {"bf16": "bf16", "fp32": "no"}[precision]


def _evaluate(accelerator: Accelerator, model, blocks, batch_size: int) -> dict:
    """Validation loss: each process scores an equal share of the blocks (equal, so FSDP's
    collective forwards line up), then the shares' losses are averaged."""
    world, rank = accelerator.num_processes, accelerator.process_index
    share = blocks[rank: len(blocks) - len(blocks) % world: world]
    model.eval()
    loss = evaluate_perplexity(model, torch.from_numpy(share.astype("int64")), batch_size, progress=False)["loss"]
    model.train()
    loss = accelerator.reduce(torch.tensor(loss, device=accelerator.device), "mean").item()
    return {"val_loss": loss, "val_ppl": math.exp(loss)}


def _layer_grad_norms(accelerator: Accelerator, layers) -> list[float]:
    """L2 norm of each decoder block's parameter gradients. Under FSDP a process holds a shard of
    every gradient (a DTensor with FSDP2), so the squared norms are summed over processes."""
    zero = torch.zeros((), device=accelerator.device)
    squares = torch.stack([
        sum((getattr(p.grad, "to_local", lambda: p.grad)().float().square().sum()
             for p in layer.parameters() if p.grad is not None), zero)
        for layer in layers
    ])
    if accelerator.distributed_type == DistributedType.FSDP:
        squares = accelerator.reduce(squares, "sum")
    return squares.sqrt().tolist()


def nonfinite_blocks(norms: list[float], layers) -> str:
    """Where a non-finite step went wrong first, for its error message: '' if every block's
    gradient norm is finite (the loss alone overflowed)."""
    bad = [i for i, norm in enumerate(norms) if not math.isfinite(norm)]
    if not bad:
        return ""
    kind = "Post-LN" if getattr(layers[bad[0]], "is_post_ln", False) else "Pre-LN"
    return f" (non-finite gradients in {len(bad)} of {len(norms)} blocks, the first block {bad[0]}, {kind})"


def _checkpoints(folder: Path) -> list[tuple[int, Path]]:
    found = [(int(p.name.removeprefix("step-")), p) for p in (folder / "checkpoints").glob("step-*")]
    return sorted(found)


def _save_checkpoint(accelerator: Accelerator, folder: Path, step: int, keep: int) -> None:
    tmp, final = folder / "checkpoints" / f".step-{step}.tmp", folder / "checkpoints" / f"step-{step}"
    if accelerator.is_main_process and tmp.exists():  # left by a run killed while saving
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    accelerator.save_state(tmp)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():  # a damaged checkpoint the resume skipped
            shutil.rmtree(final)
        tmp.rename(final)  # only complete checkpoints carry a step-N name
        for _, old in _checkpoints(folder)[:-keep] if keep else []:
            shutil.rmtree(old)


def _restore(accelerator: Accelerator, folder: Path) -> int:
    """Load the last checkpoint that loads (a damaged one is skipped with a warning), drop the
    metrics logged after it; returns its step (0: none)."""
    step = 0
    for found_step, checkpoint in reversed(_checkpoints(folder)):
        try:
            accelerator.load_state(checkpoint)
        except Exception as e:  # torch, safetensors and pickle each fail their own way on a damaged file
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            print(f"warning: {checkpoint} is damaged ({first[:200]}); trying the checkpoint before it",
                  file=sys.stderr)
            continue
        step = found_step
        break
    else:
        if _checkpoints(folder):
            raise MixLNError(f"{_checkpoints(folder)[-1][1]}: damaged, and no earlier checkpoint loads; "
                             "remove the arm's checkpoints folder to start it again")
    metrics = folder / "metrics.jsonl"
    if accelerator.is_main_process and metrics.is_file():
        kept = [line for line in _complete_lines(metrics) if json.loads(line)["step"] <= step]
        _write_atomic(metrics, "".join(line + "\n" for line in kept))
    accelerator.wait_for_everyone()
    return step


def _complete_lines(metrics: Path) -> list[str]:
    """The records of ``metrics`` (metrics.jsonl); a last line cut short by a kill is dropped, a
    damaged line before it is an error naming the file."""
    lines = [line for line in metrics.read_text(errors="replace").splitlines() if line.strip()]
    records = []
    for n, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError
        except ValueError:
            if n == len(lines):
                break  # written while the process was killed
            raise MixLNError(f"{metrics}: line {n} is damaged (not a training record); remove it to resume") from None
        records.append(line)
    return records


def _save_final(accelerator: Accelerator, model, tokenizer, folder: Path, source: str) -> None:
    state_dict = accelerator.get_state_dict(model)  # gathers FSDP shards onto the main process
    if accelerator.is_main_process:
        with atomic_output_dir(folder / "final", force=True) as tmp:
            accelerator.unwrap_model(model).save_pretrained(tmp, state_dict=state_dict)
            tokenizer.save_pretrained(tmp)
            if getattr(accelerator.unwrap_model(model).config, "post_ln_layers", None) is not None:  # Mix-LN: remote code
                copy_model_code(tmp)
    accelerator.wait_for_everyone()


def _train_arm(recipe: dict, arm: str, folder: Path, splits: Splits, tokenizer, accumulation: int,
               resume: bool, progress: bool) -> dict:
    if resume and (folder / "summary.json").is_file():
        try:  # finished before the interruption
            return json.loads((folder / "summary.json").read_text())
        except (OSError, ValueError):
            raise MixLNError(f"{folder / 'summary.json'}: damaged; remove it to train the {arm} arm again") from None
    started = time.time()
    folder.mkdir(parents=True, exist_ok=True)
    source = _arm_source(recipe, arm, folder, progress)
    accelerator = Accelerator(
        mixed_precision=_mixed_precision(recipe["precision"]),
        gradient_accumulation_steps=accumulation,
        # accelerate would step the scheduler once per process; ours counts optimizer steps
        step_scheduler_with_optimizer=False,
        log_with="tensorboard" if is_tensorboard_available() else None,
        project_dir=folder,
    )
    main = accelerator.is_main_process
    accelerator.init_trackers("tensorboard")
    set_seed(recipe["seed"])
    steps, step_tokens = optimizer_steps(recipe), recipe["global_batch_size"] * recipe["seq_len"]

    model = load_model(source, dtype=torch.float32).train()  # fp32 master weights; bf16 is autocast
    config, parameters = model.config, sum(p.numel() for p in model.parameters())
    optimizer = _adamw(model, recipe["optim"])
    scheduler = get_cosine_with_min_lr_schedule_with_warmup(
        optimizer, recipe["schedule"]["warmup_steps"], steps, min_lr_rate=recipe["schedule"]["min_lr_ratio"])
    data = PackedBlocks(splits.train, steps * recipe["global_batch_size"], recipe["seed"])
    loader = DataLoader(data, batch_size=recipe["micro_batch_size"])
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    layers = accelerator.unwrap_model(model).model.layers

    initial = _evaluate(accelerator, model, splits.validation, recipe["micro_batch_size"])
    start = _restore(accelerator, folder) if resume else 0
    batches = iter(accelerator.skip_first_batches(loader, start * accumulation) if start else loader)
    record, train_time = {}, 0.0
    bar = tqdm(range(start + 1, steps + 1), initial=start, total=steps, desc=f"train {arm}", unit="step",
               disable=not (progress and main))
    for done in bar:  # `done` optimizer steps once this one is taken
        tick = time.perf_counter()
        loss = torch.zeros((), device=accelerator.device)
        for _ in range(accumulation):
            with accelerator.accumulate(model):  # gradients sync on the last micro-batch only
                batch = next(batches)
                micro_loss = model(input_ids=batch, labels=batch).loss
                accelerator.backward(micro_loss)
                loss += micro_loss.detach() / accumulation
        record = {"step": done, "tokens": done * step_tokens, "loss": accelerator.reduce(loss, "mean").item(),
                  "lr": scheduler.get_last_lr()[0]}
        if done % recipe["grad_norm_interval"] == 0 or done == steps:
            record["grad_norm_per_layer"] = _layer_grad_norms(accelerator, layers)
        # max norm inf: no clipping, the norm alone
        record["grad_norm"] = accelerator.clip_grad_norm_(model.parameters(), recipe["grad_clip"] or math.inf).item()
        for name in ("loss", "grad_norm"):  # stop before a non-finite update reaches the weights
            if not math.isfinite(record[name]):
                found = _checkpoints(folder)
                last = found[-1][1] if found else "none, the run starts from its source"
                norms = record.get("grad_norm_per_layer") or _layer_grad_norms(accelerator, layers)
                where = nonfinite_blocks(norms, layers)
                raise MixLNError(f"{arm}: {name.replace('_', ' ')} is {record[name]} at step {done}{where}; "
                                 f"training stopped (last good checkpoint: {last})")
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        elapsed = time.perf_counter() - tick
        train_time += elapsed
        record["tokens_per_s"] = step_tokens / elapsed
        if done % recipe["eval_interval"] == 0 or done == steps:
            record.update(_evaluate(accelerator, model, splits.validation, recipe["micro_batch_size"]))
        logged = done % recipe["log_interval"] == 0 or "val_loss" in record or "grad_norm_per_layer" in record
        if main and (logged or done == steps):
            with open(folder / "metrics.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
            accelerator.log({k: v for k, v in record.items() if isinstance(v, (int, float))}, step=done)
        bar.set_postfix(loss=f"{record['loss']:.4f}")
        if done % recipe["checkpoint_interval"] == 0 and done < steps:
            _save_checkpoint(accelerator, folder, done, recipe["keep_checkpoints"])

    _save_final(accelerator, model, tokenizer, folder, source)
    summary = {
        "arm": arm, "source": source, "steps": steps, "tokens": steps * step_tokens,
        "wall_time_s": round(time.time() - started, 2), "resumed_from_step": start,
        "final_val_loss": record["val_loss"], "final_val_ppl": record["val_ppl"],
        "initial_val_loss": initial["val_loss"], "initial_val_ppl": initial["val_ppl"],
        "tokens_per_s": (steps - start) * step_tokens / train_time, "parameters": parameters,
        "num_layers": config.num_hidden_layers, "post_ln_layers": getattr(config, "post_ln_layers", 0),
        "processes": accelerator.num_processes, "precision": accelerator.mixed_precision,
    }
    if main:
        _write_atomic(folder / "summary.json", json.dumps(summary, indent=2) + "\n")
    for tracker in accelerator.trackers:  # not end_training(): it would destroy the process group the next arm needs
        tracker.finish()
    accelerator.free_memory()
    return summary
