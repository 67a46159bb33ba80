"""The whole mission at small scale in one call: pre-train a Pre-LN LLaMA from random weights,
convert it to Mix-LN, heal, train both arms, analyze every stage and compare; benchmarks/gpu.sh
runs it on one H200 (its header says how, what it records and what each phase
costs), ``--smoke`` on CPU at a tiny scale (tests/test_gpu_script.py).

The parent imports no torch until the summary; each phase runs in a child process of this
script, so a crash, a CUDA error or a kill costs that phase only, a rerun can change precision
(accelerate keeps one precision per process), and every failure leaves its full traceback in
the log. The text is the Python source files of the machine's own Python (standard library,
then site-packages): there on any machine with Python, and, unlike the embedded corpus (under
a million characters of training docstrings), enough that pre-training does not repeat it.
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import sysconfig
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Settings per scale. Budgets in tokens; the arms' budget is also capped at arm_seconds at the
# rate the pre-training measured, so a slower GPU than expected shortens them, not the call. A
# child still running at budget_s seconds is stopped; the summary follows in seconds.
SCALES = {
    "gpu": dict(shape="llama-130m", text_chars=80_000_000, seq_len=1024, micro_batch=32, batch=64,
                pretrain_tokens=12 * 2**20, pretrain_lr=1e-3, arm_tokens=12 * 2**20, arm_seconds=60, arm_lr=3e-4,
                heal_tokens=2**20, heal_batch=16, eval_tokens=2**17, analysis_tokens=2**15, analysis_batch=8,
                budget_s=500),
    "smoke": dict(shape="tiny", text_chars=300_000, seq_len=64, micro_batch=4, batch=8,
                  pretrain_tokens=24 * 512, pretrain_lr=1e-3, arm_tokens=8 * 512, arm_seconds=60, arm_lr=3e-4,
                  heal_tokens=2048, heal_batch=4, eval_tokens=1024, analysis_tokens=512, analysis_batch=4,
                  budget_s=300),
    # --throughput: the trainer's speed at the 1B class (TinyLlama-1.1B's shape with SmolLM2's
    # vocabulary, 1.17B parameters) from random weights, eager and compiled, and a profile of
    # where a step's GPU time goes; no conversion or analysis
    "gpu-throughput": dict(shape="tinyllama-1.1b", text_chars=12_000_000, seq_len=1024, micro_batch=16, batch=64,
                           steps=20, lr=3e-4, heal_batch=16, eval_tokens=2**16, budget_s=400),
    "smoke-throughput": dict(shape="tiny", text_chars=100_000, seq_len=64, micro_batch=4, batch=8,
                             steps=6, lr=3e-4, heal_batch=4, eval_tokens=512, budget_s=200),
}
EVALUATIONS = 8  # validation points per run: the validation curves
METRICS_FILES = 4  # runs whose metrics.jsonl come back: with log, summary.json, summary.txt and report.md, 8 files
WARMUP_STEPS_SKIPPED = 3  # steps left out of the median tokens/s (allocator, kernel selection)
# MFU conventions: 6N per token (N: parameters in matmuls) over the dense bf16 rate measured on
# the H200 it ran on, and 6N + attention (12 x layers x q width x seq_len) over the datasheet's
MEASURED_BF16, SPEC_BF16 = 790e12, 989e12
VALIDATION_EVERY = 25  # every 25th source file is validation text: never trained on, analyzed on


# ---------------------------------------------------------------------------------------------
# the phases' children (each in a process of its own)


def child_prepare(shape: str, tokenizer: str, work: str, text_chars: int, seq_len: int) -> dict:
    """The random-init source (the machine reaches no hub: a published shape with SmolLM2's tokenizer,
    carried) and the tokenized text; returns the text's counts."""
    import torch
    from harness import random_source  # benchmarks/harness.py, beside this script
    from transformers import AutoTokenizer

    from mixln_convert.data.tokenization import tokenize
    from mixln_convert.io.loader import open_checkpoint

    words = AutoTokenizer.from_pretrained(tokenizer)
    model = random_source(Path(work) / "sources" / shape, shape, words, dtype=torch.bfloat16,  # training loads fp32
                          vocab_size=len(words))
    print(f"{work}/sources/{shape}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters", flush=True)
    files = write_text(Path(work), text_chars)
    manifest = tokenize(f"{work}/train.jsonl", open_checkpoint(f"{work}/sources/{shape}").tokenizer, f"{work}/tokens",
                        validation=f"{work}/validation.jsonl", seq_len=seq_len, progress=False)
    return {"files": files, **{f"{split}_tokens": manifest.splits[split].tokens for split in ("train", "validation")}}


def write_text(work: Path, text_chars: int) -> int:
    """``text_chars`` characters of Python source, one document per file in sorted order, into
    train.jsonl and validation.jsonl; returns the number of files."""
    # once each: site-packages may lie inside the standard library's folder
    sources = dict.fromkeys(file.resolve() for key in ("stdlib", "purelib")
                            for file in sorted(Path(sysconfig.get_paths()[key]).rglob("*.py")))
    written, files = 0, 0
    with open(work / "train.jsonl", "w") as train, open(work / "validation.jsonl", "w") as validation:
        for file in sources:
            try:
                text = file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if not 200 <= len(text) <= 200_000:  # stubs, and generated tables that are neither prose nor code
                continue
            (validation if files % VALIDATION_EVERY == 0 else train).write(json.dumps({"text": text}) + "\n")
            written, files = written + len(text), files + 1
            if written >= text_chars:
                break
    return files


def merged(*overrides: str) -> list[str]:
    """KEY=VALUE recipe overrides, a later one replacing an earlier of the same key: load_recipe refuses a
    key given twice."""
    return [f"{key}={value}" for key, value in dict(item.split("=", 1) for item in overrides).items()]


def child_train(recipe: str, arm: str, out: str, overrides: list, resume: bool) -> dict:
    from mixln_convert.workflows.train import train
    from mixln_convert.training import load_recipe

    summary = train(load_recipe(recipe, overrides), out, (arm,), resume=resume, progress=False)[arm]
    print(f"{arm}: {summary.steps} steps, validation perplexity {summary.initial_val_ppl:.3f} -> "
          f"{summary.final_val_ppl:.3f}", flush=True)
    return {}


def child_analyze(stages: dict, out: str, data: str, seq_len: int, tokens: int, batch: int, runs: list) -> dict:
    """Each stage analyzed (layer drop, angular distances, gradient norms, pruning curve), then
    one report over them and the training runs; a stage that fails is left out of the report."""
    from mixln_convert.analysis.analyze import analyze
    from mixln_convert.report import compare

    done = {}
    for name, checkpoint in stages.items():
        try:
            analyze(checkpoint, f"{out}/{name}", data=data, seq_len=seq_len, max_tokens=tokens, batch_size=batch,
                    prune_curve=True, progress=False)
            done[name] = f"{out}/{name}"
        except Exception:
            print(f"analysis of {name} ({checkpoint}) failed:", flush=True)
            traceback.print_exc()
    inputs = {**done, **{Path(run).name: run for run in runs}}
    result = compare(list(inputs.values()), f"{out}/report", labels=list(inputs))
    return {"analyzed": list(done), "summary": result.summary, "notes": result.notes}


def child_profile(source: str, seq_len: int, micro_batch: int) -> dict:
    """Where a training step's GPU time goes: forward, backward and fused AdamW of one micro-batch
    under bf16 autocast (the trainer's precision), 3 steps after 2 of warm-up, under
    torch.profiler; the kernels' time by kind and the share of the wall time the GPU was busy."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=cuda)
    batch = torch.randint(0, model.config.vocab_size, (micro_batch, seq_len), device=device)

    def step():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=cuda):
            loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        tick = time.perf_counter()
        for _ in range(3):
            step()
        if cuda:
            torch.cuda.synchronize()
        wall_us = (time.perf_counter() - tick) * 1e6
    kinds = {"matmul": ("gemm", "cutlass", "xmma", "nvjet", "cublas", "aten::mm", "addmm", "bmm"),
             "attention": ("flash", "fmha", "attention", "sdpa"),
             "optimizer": ("adam", "foreach", "multi_tensor"), "loss": ("softmax", "nll", "cross_entropy")}
    by_kind, kernels = dict.fromkeys([*kinds, "other"], 0.0), []
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", 0) if cuda else event.self_cpu_time_total
        if not us or (cuda and event.device_type != torch.autograd.DeviceType.CUDA):
            continue
        name = event.key.lower()
        by_kind[next((kind for kind, marks in kinds.items() if any(m in name for m in marks)), "other")] += us
        kernels.append((us, event.key[:90]))
    busy = sum(by_kind.values())
    return {"micro_batch": micro_batch, "wall_ms_per_step": wall_us / 3e3, "busy_share": busy / wall_us,
            "share_by_kind": {kind: us / busy for kind, us in by_kind.items()},
            "top_kernels": [[name, us / busy] for us, name in sorted(kernels, reverse=True)[:12]]}


CHILDREN = {"prepare": child_prepare, "train": child_train, "analyze": child_analyze, "profile": child_profile}


def run_child(kind: str, kwargs: dict, status: Path) -> None:
    """A child's body: its result, or its error with the full traceback, into ``status``."""
    try:
        result = {"ok": True, **CHILDREN[kind](**kwargs)}
    except BaseException as e:
        from mixln_convert.training.loop import NonFiniteStep

        causes = [e]
        while causes[-1].__cause__ or causes[-1].__context__:
            causes.append(causes[-1].__cause__ or causes[-1].__context__)
        nonfinite = next((c for c in causes if isinstance(c, NonFiniteStep)), None)
        # the trainer re-raises a step's error `from None` (its one line names the checkpoint to
        # resume from); the traceback should still reach where the value was found
        for c in causes:
            c.__suppress_context__ = False
        traceback.print_exception(e)
        step = re.search(r"at step (\d+)", str(nonfinite)) if nonfinite else None
        result = {"ok": False, "error": (str(e).strip().splitlines() or [type(e).__name__])[0],
                  "nonfinite": nonfinite is not None, "step": int(step.group(1)) if step else None}
    status.write_text(json.dumps(result))
    sys.exit(0 if result["ok"] else 1)


# ---------------------------------------------------------------------------------------------
# the parent


class Mission:
    script = __file__  # the file whose `--child` runs each phase (a subclass elsewhere names its own)

    def __init__(self, scale: dict, work: Path, out: Path, tokenizer: str, overrides: list[str]):
        self.s, self.work, self.out, self.tokenizer, self.overrides = scale, work, out, tokenizer, overrides
        self.started = time.monotonic()
        self.log = open(out / "log.txt", "a", buffering=1)
        self.phases, self.runs, self.bisect, self.figures = [], {}, {}, {}

    def left(self) -> float:
        return self.s["budget_s"] - (time.monotonic() - self.started)

    def phase(self, name: str, kind: str, kwargs: dict, estimate_s: float, needed: bool = True,
              cap_s: float | None = None) -> dict:
        """Run one child; an optional phase (``needed`` False) that would end past ``budget_s`` is
        skipped, and any child still running then, or ``cap_s`` seconds after it started, is
        stopped: the summary comes after it."""
        if not needed and self.left() < estimate_s:
            return self._record(name, {"ok": False, "error": f"skipped: {self.left():.0f} s left, ~{estimate_s} s needed"}, 0)
        status = self.work / f"{name}.status.json"
        status.unlink(missing_ok=True)
        self.log.write(f"\n===== {name} ({kind}) =====\n")
        print(f"{time.monotonic() - self.started:6.0f} s  {name} ...", flush=True)
        tick = time.monotonic()
        child = subprocess.Popen([sys.executable, self.script, "--child", kind, json.dumps(kwargs), str(status)],
                                 stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            child.wait(timeout=max(1.0, min(self.left(), cap_s or float("inf"))))
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        result = (json.loads(status.read_text()) if status.is_file()
                  else {"ok": False, "error": f"stopped after {time.monotonic() - tick:.0f} s (exit {child.returncode}, "
                                              "time budget or crash: see log.txt)"})
        return self._record(name, result, time.monotonic() - tick)

    def _record(self, name: str, result: dict, seconds: float) -> dict:
        self.phases.append({"phase": name, "ok": result["ok"], "seconds": round(seconds, 1),
                            **({} if result["ok"] else {"error": result["error"]})})
        print(f"{time.monotonic() - self.started:6.0f} s  {name}: "
              f"{'ok' if result['ok'] else result['error']} ({seconds:.0f} s)", flush=True)
        return result

    def recipe(self, name: str, source: str, tokens: int, lr: float, heal_tokens: int, seed: int) -> str:
        s = self.s
        steps = tokens // (s["batch"] * s["seq_len"])
        recipe = {
            "source": source, "heal": {"tokens": heal_tokens, "seq_len": s["seq_len"], "batch_size": s["heal_batch"]},
            "data": {"train": str(self.work / "tokens"), "validation": None, "eval_tokens": s["eval_tokens"]},
            "seq_len": s["seq_len"], "micro_batch_size": s["micro_batch"], "global_batch_size": s["batch"],
            "max_tokens": tokens, "optim": {"lr": lr}, "schedule": {"warmup_steps": max(1, steps // 10)},
            "log_interval": 1, "eval_interval": max(1, steps // EVALUATIONS), "grad_norm_interval": max(1, steps // EVALUATIONS),
            "checkpoint_interval": steps + 1,  # no checkpoints: resume is not what this call shows
            "seed": seed,
        }
        path = self.work / f"{name}.yaml"
        path.write_text(json.dumps(recipe))  # JSON is YAML
        return str(path)

    def train(self, name: str, recipe: str, arm: str, out: Path, estimate_s: float, resume: bool = False,
              overrides: tuple = (), needed: bool = True, cap_s: float | None = None) -> bool:
        """One arm; on a non-finite value, the same arm again in fp32 and with eager attention,
        each to a few steps past the failing one: which of them gets past it names the cause.
        ``needed`` and ``cap_s``: as :meth:`phase` takes them (the reruns are never needed)."""
        kwargs = {"recipe": recipe, "arm": arm, "out": str(out), "overrides": merged(*self.overrides, *overrides),
                  "resume": resume}
        result = self.phase(name, "train", kwargs, estimate_s, needed, cap_s)
        if result["ok"]:
            self.runs[name] = out / arm
            return True
        if result.get("nonfinite"):
            step_tokens = self.s["batch"] * self.s["seq_len"]
            cut = [f"max_tokens={(result['step'] + 5) * step_tokens}"] if result["step"] else []
            self.bisect[name] = {"error": result["error"]}
            for variant, setting in (("fp32", "precision=fp32"), ("eager", "attention=eager")):
                rerun = self.work / f"{name}-{variant}"
                kwargs = {**kwargs, "out": str(rerun), "resume": False,
                          "overrides": merged(*self.overrides, *overrides, *cut, setting)}
                again = self.phase(f"{name}-{variant}", "train", kwargs, estimate_s, needed=False, cap_s=cap_s)
                self.bisect[name][variant] = "passed" if again["ok"] else again["error"]
                if again["ok"]:
                    self.runs[f"{name}-{variant}"] = rerun / arm
        return False

    def prepare(self) -> bool:
        """The random-init source and the tokenized text (the first phase of either run)."""
        s = self.s
        prepared = self.phase("prepare", "prepare", {"shape": s["shape"], "tokenizer": self.tokenizer,
                                                     "work": str(self.work), "text_chars": s["text_chars"],
                                                     "seq_len": s["seq_len"]}, 60)
        if prepared["ok"]:
            self.figures["text"] = {k: prepared[k] for k in ("files", "train_tokens", "validation_tokens")}
        return prepared["ok"]

    def run(self) -> None:
        s, work = self.s, self.work
        if not self.prepare():
            return
        pretrain = self.recipe("pretrain", str(work / "sources" / s["shape"]), s["pretrain_tokens"], s["pretrain_lr"], 0, 0)
        if not self.train("pretrain", pretrain, "preln", work / "pretrain", 180):
            return
        rate = self.rate(work / "pretrain" / "preln")
        step_tokens = s["batch"] * s["seq_len"]
        arm_tokens = max(step_tokens * EVALUATIONS, min(s["arm_tokens"], int(rate * s["arm_seconds"])))
        pretrained = str(work / "pretrain" / "preln" / "final")
        # seed 1: another sample of the text than the pre-training's first steps
        main = self.recipe("main", pretrained, arm_tokens - arm_tokens % step_tokens, s["arm_lr"], s["heal_tokens"], 1)
        # the control first: a Mix-LN arm that fails then has its reruns after both arms, where only
        # the optional analysis can lose their time
        arm_s = 30 + s["arm_seconds"]
        preln_ok = self.train("preln", main, "preln", work / "main", arm_s)
        mixln_ok = self.train("mixln", main, "mixln", work / "main", arm_s, resume=(work / "main" / "recipe.yaml").is_file())
        converted = work / "main" / "mixln"
        stages = {"pretrained": pretrained, "converted": str(converted / "converted"), "healed": str(converted / "healed"),
                  "mixln-trained": str(converted / "final"), "preln-trained": str(work / "main" / "preln" / "final")}
        stages = {name: path for name, path in stages.items() if (Path(path) / "config.json").is_file()}
        analyzed = self.phase("analyze", "analyze", {
            "stages": stages, "out": str(work / "analysis"), "data": str(work / "validation.jsonl"),
            "seq_len": s["seq_len"], "tokens": s["analysis_tokens"], "batch": s["analysis_batch"],
            "runs": [str(work / "main")] if mixln_ok and preln_ok else []}, 60, needed=False)
        if analyzed["ok"]:
            self.figures["comparison"] = {k: analyzed[k] for k in ("analyzed", "summary", "notes")}

    def run_throughput(self, arm: str) -> None:
        s, work = self.s, self.work
        if not self.prepare():
            return
        source = str(work / "sources" / s["shape"])
        recipe = self.recipe("throughput", source, s["steps"] * s["batch"] * s["seq_len"], s["lr"], 0, 0)
        # the Mix-LN arm: the random source converted (calibrated, alpha 0.25) and trained unhealed
        self.train("eager", recipe, arm, work / "eager", 120)
        self.train("compiled", recipe, arm, work / "compiled", 180, overrides=("compile=true",))
        if arm != "preln":  # the profile is of the source's (Pre-LN) step
            return
        profiled = self.phase("profile", "profile", {"source": source, "seq_len": s["seq_len"],
                                                     "micro_batch": s["micro_batch"]}, 40, needed=False)
        if profiled["ok"]:
            self.figures["profile"] = {k: v for k, v in profiled.items() if k != "ok"}

    def rate(self, arm: Path) -> float:
        records = [json.loads(line) for line in (arm / "metrics.jsonl").read_text().splitlines()]
        rates = [r["tokens_per_s"] for r in records[WARMUP_STEPS_SKIPPED:]] or [r["tokens_per_s"] for r in records]
        return statistics.median(rates)

    def summarize(self) -> dict:
        """Every figure, from the runs' own files, into summary.json and summary.txt; the metrics
        and the report beside them."""
        import accelerate
        import torch
        import transformers

        from mixln_convert.training import load_recipe
        from mixln_convert.training.memory import DEFAULT_HARDWARE, estimate, model_shapes

        runs = {}
        for name, arm in self.runs.items():
            summary = json.loads((arm / "summary.json").read_text())
            records = [json.loads(line) for line in (arm / "metrics.jsonl").read_text().splitlines()]
            recipe = load_recipe(arm.parent / "recipe.yaml")
            cost = estimate(recipe, DEFAULT_HARDWARE, model_shapes(summary["source"]))
            rate = self.rate(arm)
            norms = [r for r in records if "grad_norm_per_layer" in r]
            runs[name] = {
                **{k: summary[k] for k in ("arm", "steps", "tokens", "parameters", "num_layers", "post_ln_layers",
                                           "precision", "attention", "wall_time_s", "initial_val_ppl", "final_val_ppl",
                                           "peak_gpu_memory_bytes")},
                "tokens_per_s_median": rate, "tokens_per_s_run": summary["tokens_per_s"],
                "mfu_6n_measured_790": rate * cost.flops / cost.step_tokens / MEASURED_BF16,
                "mfu_6n_attention_spec_989": rate * (cost.flops + cost.attention_flops) / cost.step_tokens / SPEC_BF16,
                "flops_per_token_6n": cost.flops / cost.step_tokens,
                "flops_per_token_attention": cost.attention_flops / cost.step_tokens,
                "estimated_gpu_memory_bytes": cost.total(recipe.activation_checkpointing),
                "loss_first_last": [records[0]["loss"], records[-1]["loss"]],
                "validation_curve": [[0, summary["initial_val_ppl"]]]
                + [[r["step"], r["val_ppl"]] for r in records if "val_ppl" in r],
                "grad_norm_per_layer_first_last": [norms[0]["grad_norm_per_layer"], norms[-1]["grad_norm_per_layer"]]
                if norms else None,
                "skipped_steps": sum(1 for r in records if r.get("skipped")),
            }
        for name, arm in list(self.runs.items())[:METRICS_FILES]:
            (self.out / f"{name}.metrics.jsonl").write_text((arm / "metrics.jsonl").read_text())
        analysis = {}
        for folder in sorted((self.work / "analysis").glob("*/analysis.json")):
            a = json.loads(folder.read_text())
            analysis[folder.parent.name] = {
                "perplexity": a["perplexity"], "post_ln_layers": a["post_ln_layers"], "layer_drop": a["layer_drop"],
                "grad_norm_per_layer": a["grad_norm_per_layer"], "angular_distance": a["angular_distance"],
                "prune_curve": a["prune_curve"]["perplexity"] if "prune_curve" in a else None}
        report = self.work / "analysis" / "report" / "report.md"
        if report.is_file():
            (self.out / "report.md").write_text(report.read_text())
        result = {"elapsed_s": round(time.monotonic() - self.started, 1), "settings": self.s,
                  "overrides": self.overrides,  # --set, applied to every training run
                  "environment": {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                                  "python": sys.version.split()[0], "torch": torch.__version__,
                                  "transformers": transformers.__version__, "accelerate": accelerate.__version__},
                  "conventions": {
                      "tokens_per_s_median": f"median over steps after the first {WARMUP_STEPS_SKIPPED} of the trainer's "
                                             "per-step rate (CUDA synchronized before each step's clock stops)",
                      "mfu_6n_measured_790": "6N per token, N the parameters in matmuls (the input embedding, a lookup, "
                                             "left out), over 790 TFLOP/s (H200 dense bf16, measured)",
                      "mfu_6n_attention_spec_989": "6N + 12 x layers x q width x seq_len per token (attention's QK^T "
                                                   "and AV, causal half not subtracted) over 989 TFLOP/s (datasheet)",
                      "peak_gpu_memory_bytes": "torch.cuda.max_memory_allocated over the arm (null on CPU)",
                      "estimated_gpu_memory_bytes": "mixln-convert estimate's total for the recipe, one GPU"},
                  **self.figures, "phases": self.phases, "runs": runs, "analysis": analysis, "bisect": self.bisect}
        (self.out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
        (self.out / "summary.txt").write_text(text_summary(result))
        return result


def text_summary(r: dict) -> str:
    lines = [f"elapsed {r['elapsed_s']} s; phases: " + ", ".join(
        f"{p['phase']} {'ok' if p['ok'] else 'FAILED'} {p['seconds']} s" for p in r["phases"])]
    for p in r["phases"]:
        if not p["ok"]:
            lines.append(f"  {p['phase']}: {p['error']}")
    for name, run in r["runs"].items():
        memory = run["peak_gpu_memory_bytes"]
        lines.append(f"{name}: {run['steps']} steps, {run['parameters'] / 1e6:.1f}M parameters, {run['precision']}, "
                     f"{run['attention']}; {run['tokens_per_s_median']:,.0f} tokens/s; MFU {run['mfu_6n_measured_790']:.1%} "
                     f"(6N/790T), {run['mfu_6n_attention_spec_989']:.1%} (6N+attention/989T); peak GPU memory "
                     f"{'n/a' if memory is None else f'{memory / 1e9:.2f} GB'} (estimate "
                     f"{run['estimated_gpu_memory_bytes'] / 1e9:.2f} GB); val ppl {run['initial_val_ppl']:.2f} -> "
                     f"{run['final_val_ppl']:.2f}; loss {run['loss_first_last'][0]:.3f} -> {run['loss_first_last'][1]:.3f}")
    for name, a in r["analysis"].items():
        cheapest = min(range(len(a["layer_drop"])), key=a["layer_drop"].__getitem__)
        lines.append(f"{name}: ppl {a['perplexity']:.2f}, {a['post_ln_layers']} Post-LN blocks; layer drop "
                     + " ".join(f"{d:+.2f}" for d in a["layer_drop"]) + f" (cheapest block {cheapest}); grad norms "
                     + " ".join(f"{g:.3g}" for g in a["grad_norm_per_layer"]))
    if "profile" in r:
        p = r["profile"]
        lines.append(f"profile (micro-batch {p['micro_batch']}, eager): {p['wall_ms_per_step']:.0f} ms a micro-step, "
                     f"GPU busy {p['busy_share']:.0%} of it; kernel time " + ", ".join(
                         f"{kind} {share:.0%}" for kind, share in p["share_by_kind"].items()))
        lines += [f"  {share:6.1%}  {name}" for name, share in p["top_kernels"]]
    for arm, found in r["bisect"].items():
        lines.append(f"bisect {arm}: {json.dumps(found)}")
    lines += [f"- {sentence}" for sentence in r.get("comparison", {}).get("summary", [])]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny scale, on CPU")
    parser.add_argument("--tokenizer", default=str(ROOT / ".gpu" / "tokenizer"), help="a tokenizer folder")
    parser.add_argument("--throughput", action="store_true",
                        help="the trainer's speed at the 1B class, eager and compiled, and a profile (no conversion)")
    parser.add_argument("--arm", default="preln", choices=("preln", "mixln"), help="the arm --throughput trains")
    parser.add_argument("--budget-s", type=float, default=None, help="stop children after this many seconds")
    parser.add_argument("--work", default=None, help="working folder (default: a new temporary one)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a recipe override for every training run (repeatable)")
    parser.add_argument("--save-tokenizer", metavar="DIR",
                        help="here, once: save SmolLM2's tokenizer (from the cached GGUF) into DIR, and exit")
    args = parser.parse_args()
    import tempfile

    if args.save_tokenizer:  # the device has neither the GGUF nor a network: .gpu/ travels with the call
        from mixln_convert.fetch import smollm2_gguf
        from mixln_convert.surgery.loading import load_tokenizer

        load_tokenizer(smollm2_gguf()).save_pretrained(args.save_tokenizer)
        return

    if args.smoke:  # tensors this small gain nothing from threads, which only contend with other work
        os.environ.setdefault("OMP_NUM_THREADS", "1")

    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu-mission-out-"))
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu-mission-"))
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    scale = ("smoke" if args.smoke else "gpu") + ("-throughput" if args.throughput else "")
    settings = {**SCALES[scale], **({"budget_s": args.budget_s} if args.budget_s else {})}
    mission = Mission(settings, work, out, args.tokenizer, args.overrides)
    finish(mission, out, (lambda m: m.run_throughput(args.arm)) if args.throughput else Mission.run)


def finish(mission: Mission, out: Path, work) -> None:
    """``work(mission)``, then its summary written and printed whatever happened, and the exit status:
    0 when every phase passed or was skipped for time."""
    try:
        work(mission)
    finally:
        result = mission.summarize()
        print((out / "summary.txt").read_text(), end="")
        print(f"wrote {out}")
    sys.exit(0 if all(p["ok"] or p["error"].startswith("skipped") for p in result["phases"]) else 1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        run_child(sys.argv[2], json.loads(sys.argv[3]), Path(sys.argv[4]))
    main()
