"""Downstream evaluation cost, side by side in one run on one folder and task:

1. ``mixln-convert eval FOLDER --tasks T`` against ``lm_eval --model hf`` (pretrained=FOLDER,
   trust_remote_code=True), each a fresh process, same task, limit and batch size, alternated
   ``--repeats`` times (the fastest of each counts: on a shared machine the slow runs are the
   neighbours' doing); their metrics must agree.
2. The task layer-drop sweep (``analyze --task``'s: every block skipped in memory, the prefix
   reused) against the paper's way, one saved copy per removed block (``mixln-convert prune``)
   and an lm-eval run on each: ``--copies`` of those L runs are timed and the mean is scaled by L.

    python benchmarks/downstream.py [--folder DIR] [--task mixln_langref_next] [--limit 50]

Without --folder, SmolLM2-135M (``mixln-convert fetch``) is converted to Mix-LN into a temporary
folder first (not timed).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mixln_convert.evaluation.tasks import shipped_tasks_dir

ENV = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
TOOL = [sys.executable, "-m", "mixln_convert.cli"]


def timed(cmd) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=ENV)
    if done.returncode:
        sys.exit(f"{' '.join(map(str, cmd))} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started, done.stdout


def lm_eval_run(folder: Path, task: str, limit: int, batch_size: int, out: Path) -> tuple[float, dict]:
    """Seconds of an ``lm_eval --model hf`` process on ``folder``, and its metrics of ``task``."""
    seconds, _ = timed([sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
                        f"pretrained={folder},trust_remote_code=True", "--tasks", task, "--include_path",
                        shipped_tasks_dir(), "--limit", limit, "--batch_size", batch_size, "--device", "cpu",
                        "--output_path", out])
    result, = out.rglob("results_*.json")
    values = json.loads(result.read_text())["results"][task]
    return seconds, {k.split(",")[0]: v for k, v in values.items() if "," in k and "_stderr" not in k}


SWEEP = """
import json, sys, torch
from mixln_convert.analysis.task_drop import task_layer_drop
from mixln_convert.evaluation.downstream import task_manager
from mixln_convert.io.loader import open_checkpoint
folder, task, limit, batch_size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
source = open_checkpoint(folder)
model = source.model(dtype=torch.float32)
print(json.dumps(task_layer_drop(model, source.tokenizer, task, task_manager([task]), limit=limit,
                                 batch_size=batch_size, progress=False)))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, help="checkpoint folder (default: SmolLM2-135M converted)")
    parser.add_argument("--task", default="mixln_langref_next")
    parser.add_argument("--limit", type=int, default=50, help="examples for the eval comparison")
    parser.add_argument("--sweep-limit", type=int, default=8, help="examples for the layer-drop sweep")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--copies", type=int, default=2, help="saved copies timed for the paper's way")
    parser.add_argument("--repeats", type=int, default=2, help="alternated runs of each in the eval comparison")
    parser.add_argument("--skip-sweep", action="store_true", help="only the eval comparison")
    parser.add_argument("--skip-eval", action="store_true", help="only the layer-drop sweep")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        folder = args.folder
        if folder is None:
            gguf = timed([*TOOL, "fetch"])[1].strip()
            folder = tmp / "smollm2-mixln"
            timed([*TOOL, "convert", gguf, folder])
        num_layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]

        print(f"1. {args.task}, --limit {args.limit}, batch size {args.batch_size}, {folder.name} "
              f"({num_layers} blocks), CPU threads {os.cpu_count()}")
        ours_times, theirs_times = [], []
        for repeat in range(0 if args.skip_eval else args.repeats):
            ours_s, out = timed([*TOOL, "eval", folder, "--tasks", args.task, "--limit", args.limit, "--batch-size",
                                 args.batch_size, "--json"])
            ours = json.loads(out.strip().splitlines()[-1])["tasks"][args.task]["metrics"]
            theirs_s, theirs = lm_eval_run(folder, args.task, args.limit, args.batch_size, tmp / f"lm_eval-{repeat}")
            ours_times.append(ours_s)
            theirs_times.append(theirs_s)
            print(f"   run {repeat + 1}: mixln-convert eval --tasks {ours_s:6.1f} s, lm_eval --model hf {theirs_s:6.1f} s")
        if ours_times:
            agree = all(abs(ours[k] - theirs[k]) <= 1e-6 * max(1.0, abs(theirs[k])) for k in ours)
            print(f"   metrics: eval --tasks {ours}, lm_eval {theirs}; agree: {agree}")
            print(f"   ratio eval --tasks / lm_eval (fastest of each): {min(ours_times) / min(theirs_times):.2f}")

        if args.skip_sweep:
            return
        print(f"2. layer drop on {args.task}, --limit {args.sweep_limit}: all {num_layers} blocks")
        sweep_s, out = timed([sys.executable, "-c", SWEEP, folder, args.task, args.sweep_limit, args.batch_size])
        sweep = json.loads(out.strip().splitlines()[-1])
        per_copy = []
        for layer in range(args.copies):
            copy = tmp / f"without-{layer}"
            prune_s, _ = timed([*TOOL, "prune", folder, copy, "--layers", layer])
            run_s, values = lm_eval_run(copy, args.task, args.sweep_limit, args.batch_size, tmp / f"lm_eval-{layer}")
            per_copy.append(prune_s + run_s)
            change = values[sweep["metric"]] - sweep["value"]
            print(f"   block {layer}: saved copy {prune_s:.1f} s + lm_eval {run_s:.1f} s; {sweep['metric']} change "
                  f"{change:+.4f} (in-memory sweep: {sweep['layer_drop'][layer]:+.4f})")
        separate = sum(per_copy) / len(per_copy) * num_layers
        print(f"   in-memory sweep (one process, prefix reused): {sweep_s:6.1f} s")
        print(f"   {num_layers} saved copies + lm_eval runs (mean of {args.copies} x {num_layers}): {separate:6.1f} s")
        print(f"   ratio sweep / separate runs: {sweep_s / separate:.3f}")


if __name__ == "__main__":
    main()
