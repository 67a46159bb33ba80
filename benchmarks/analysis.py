"""Analysis and downstream evaluation: the layer-drop sweep's reuse of the residual stream against
L separate forwards, and `eval --tasks` and the task layer-drop sweep against lm-eval runs on
saved copies (the paper's way).
"""

import json
import math
import os
import sys
import tempfile
from pathlib import Path

from . import harness


def layer_drop(argv):
    """Cost of the layer-drop sweep against L independent forward passes.

    The sweep (``analysis.layers.removal_sweep``) makes one full pass that keeps the residual
    stream, then each skipped block's run continues from its stored input. It is timed against L
    forwards with one block skipped each (a naive sweep) and L full ones (the issue's yardstick, L
    forward passes of the model). --model defaults to the embedded SmolLM2-135M GGUF; ``--shape``
    builds a published LLaMA-family configuration with random weights and scores random tokens (a
    pass costs the same whatever the values, so the ratio is that of the real model; its
    perplexities mean nothing). All three run the same model on the same token windows through the
    same code (``BlockRunner``), timed interleaved, block by block, so that load from other
    processes on a shared machine weighs on all alike; the sweep's time includes its full-model pass.

    The sweep saves block work only: with b the cost of a block and h that of the head (final norm,
    vocabulary projection, loss), it costs (L + L(L-1)/2) b + (L+1) h against L((L-1) b + h) skipped
    or L(L b + h) full, i.e. about 1/2 + 1/L where the head is cheap. SmolLM2-135M's head (vocabulary
    49152 x hidden 576) costs ~8 of its 30 blocks, which lifts its ratio to ~0.63 whatever the code
    (an exact perplexity needs every logit); TinyLlama-1.1B's (32000 x 2048) costs ~1.5 of its 22.
    """
    p = harness.parser(layer_drop)
    p.add_argument("--model", help="HF folder or .gguf (default: the SmolLM2-135M GGUF)")
    p.add_argument("--shape", choices=sorted(harness.SHAPES), help="a published configuration with random weights")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=4 * 256)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=3, help="timings per step, the fastest counted")
    args = p.parse_args(argv)
    import torch

    from mixln_convert.analysis.layers import BlockRunner
    from mixln_convert.data import read_texts, token_windows
    from mixln_convert.surgery.loading import load_model, load_tokenizer

    if args.shape:
        runner = BlockRunner(harness.random_model(args.shape).to(args.device))
        windows = torch.randint(harness.SHAPES[args.shape]["vocab_size"], (args.max_tokens // args.seq_len, args.seq_len))
        name = f"{args.shape} (random weights)"
    else:
        name = harness.source(args.model)
        runner = BlockRunner(load_model(name, dtype=torch.float32, device=args.device))
        windows = token_windows(load_tokenizer(name), read_texts(None, "validation"), args.seq_len, args.max_tokens)
    windows = windows.to(args.device)
    num_layers = runner.num_layers
    seconds = {"skipped": 0.0, "full": 0.0, "sweep": 0.0}

    def timed(variant: str, work):
        """``work()``'s result; its fastest of ``--repeats`` runs back to back (the one least disturbed by
        other processes) counts. Every timed step ends in ``nll(...)``, whose ``.item()`` waits for the device."""
        fastest, result = math.inf, None
        for _ in range(args.repeats):
            took, result = harness.timed(work)
            fastest = min(fastest, took)
        seconds[variant] += fastest
        return result

    skipped_nll, sweep_nll = [0.0] * num_layers, [0.0] * num_layers
    with torch.no_grad():
        first = windows[:args.batch_size]
        runner.nll(runner.run(*runner.embed(first)), first)  # warm-up: first calls allocate and pick kernels
        for start in range(0, len(windows), args.batch_size):
            batch = windows[start:start + args.batch_size]
            stream = timed("sweep", lambda: runner.stream(batch))
            timed("sweep", lambda: runner.nll(stream.residual[-1], batch))
            for layer in range(num_layers):
                skipped_nll[layer] += timed("skipped", lambda: runner.nll(
                    runner.run(*runner.embed(batch), skip={layer}), batch)).sum().item()
                timed("full", lambda: runner.nll(runner.run(*runner.embed(batch)), batch))
                sweep_nll[layer] += timed("sweep", lambda: runner.nll_without(stream, [layer])).sum().item()
    tokens = windows[:, 1:].numel()
    worst = max(abs(math.exp(a / tokens) - math.exp(b / tokens)) / math.exp(a / tokens)
                for a, b in zip(skipped_nll, sweep_nll))
    print(f"{name}: {num_layers} layers, {windows.shape[0]} x {windows.shape[1]} tokens, "
          f"{args.device}, {torch.get_num_threads()} CPU threads, fastest of {args.repeats} timings per step")
    print(f"{num_layers} forwards, one block skipped each: {seconds['skipped']:8.2f} s")
    print(f"{num_layers} full forwards:                   {seconds['full']:8.2f} s")
    print(f"reuse sweep, incl. its full pass:        {seconds['sweep']:8.2f} s")
    print(f"ratio sweep / skipped forwards:          {seconds['sweep'] / seconds['skipped']:8.3f}"
          f"   (largest relative perplexity difference {worst:.1e})")
    print(f"ratio sweep / full forwards:             {seconds['sweep'] / seconds['full']:8.3f}")


SWEEP = """
import json, sys, torch
from mixln_convert.analysis.task_drop import task_layer_drop
from mixln_convert.evaluation.downstream import task_manager
from mixln_convert.io.loader import open_checkpoint
folder, task, limit, batch_size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
source = open_checkpoint(folder)
model = source.model(dtype=torch.float32)
print(json.dumps(task_layer_drop(model, source.tokenizer, task, task_manager([task]), limit=limit,
                                 batch_size=batch_size, progress=False).to_dict()))
"""


def downstream(argv):
    """`eval --tasks` against lm-eval, and the task layer-drop sweep against saved copies.

    Downstream evaluation cost, side by side in one run on one folder and task:

    1. ``mixln-convert eval FOLDER --tasks T`` against ``lm_eval --model hf`` (pretrained=FOLDER,
       trust_remote_code=True), each a fresh process, same task, limit and batch size, alternated
       ``--repeats`` times (the fastest of each counts: on a shared machine the slow runs are the
       neighbours' doing); their metrics must agree.
    2. The task layer-drop sweep (``analyze --task``'s: every block skipped in memory, the prefix
       reused) against the paper's way, one saved copy per removed block (``mixln-convert prune``)
       and an lm-eval run on each: ``--copies`` of those L runs are timed and the mean is scaled by L.

    Without --folder, SmolLM2-135M (``mixln-convert fetch``) is converted to Mix-LN into a temporary
    folder first (not timed).
    """
    p = harness.parser(downstream)
    p.add_argument("--folder", type=Path, help="checkpoint folder (default: SmolLM2-135M converted)")
    p.add_argument("--task", default="mixln_langref_next")
    p.add_argument("--limit", type=int, default=50, help="examples for the eval comparison")
    p.add_argument("--sweep-limit", type=int, default=8, help="examples for the layer-drop sweep")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--copies", type=int, default=2, help="saved copies timed for the paper's way")
    p.add_argument("--repeats", type=int, default=2, help="alternated runs of each in the eval comparison")
    p.add_argument("--skip-sweep", action="store_true", help="only the eval comparison")
    p.add_argument("--skip-eval", action="store_true", help="only the layer-drop sweep")
    args = p.parse_args(argv)
    from mixln_convert.evaluation.tasks import shipped_tasks_dir

    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}

    def timed(command) -> tuple[float, str]:
        seconds, _, out = harness.run(command, env)
        return seconds, out

    def lm_eval_run(folder: Path, limit: int, out: Path) -> tuple[float, dict]:
        """Seconds of an ``lm_eval --model hf`` process on ``folder``, and its metrics of the task."""
        seconds, _ = timed([sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
                            f"pretrained={folder},trust_remote_code=True", "--tasks", args.task, "--include_path",
                            shipped_tasks_dir(), "--limit", limit, "--batch_size", args.batch_size, "--device", "cpu",
                            "--output_path", out])
        result, = out.rglob("results_*.json")
        values = json.loads(result.read_text())["results"][args.task]
        return seconds, {k.split(",")[0]: v for k, v in values.items() if "," in k and "_stderr" not in k}

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        folder = args.folder
        if folder is None:
            gguf = timed([*harness.CLI, "fetch"])[1].strip()
            folder = tmp / "smollm2-mixln"
            timed([*harness.CLI, "convert", gguf, folder])
        num_layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]

        print(f"1. {args.task}, --limit {args.limit}, batch size {args.batch_size}, {folder.name} "
              f"({num_layers} blocks), CPU threads {os.cpu_count()}")
        ours_times, theirs_times = [], []
        for repeat in range(0 if args.skip_eval else args.repeats):
            ours_s, out = timed([*harness.CLI, "eval", folder, "--tasks", args.task, "--limit", args.limit,
                                 "--batch-size", args.batch_size, "--json"])
            ours = json.loads(out.strip().splitlines()[-1])["tasks"][args.task]["metrics"]
            theirs_s, theirs = lm_eval_run(folder, args.limit, tmp / f"lm_eval-run{repeat}")
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
            prune_s, _ = timed([*harness.CLI, "prune", folder, copy, "--layers", layer])
            run_s, values = lm_eval_run(copy, args.sweep_limit, tmp / f"lm_eval-without-{layer}")
            per_copy.append(prune_s + run_s)
            change = values[sweep["metric"]] - sweep["value"]
            print(f"   block {layer}: saved copy {prune_s:.1f} s + lm_eval {run_s:.1f} s; {sweep['metric']} change "
                  f"{change:+.4f} (in-memory sweep: {sweep['layer_drop'][layer]:+.4f})")
        separate = sum(per_copy) / len(per_copy) * num_layers
        print(f"   in-memory sweep (one process, prefix reused): {sweep_s:6.1f} s")
        print(f"   {num_layers} saved copies + lm_eval runs (mean of {args.copies} x {num_layers}): {separate:6.1f} s")
        print(f"   ratio sweep / separate runs: {sweep_s / separate:.3f}")


CASES = {
    "layer-drop": harness.Case(layer_drop, "~5 min", ["--shape", "tiny", "--seq-len", "64", "--max-tokens", "128",
                                                      "--batch-size", "2", "--repeats", "1"]),
    "downstream": harness.Case(downstream, "~30 min", ["--limit", "2", "--sweep-limit", "1", "--copies", "1",
                                                        "--repeats", "1"]),
}
