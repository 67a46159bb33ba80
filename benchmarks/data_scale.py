"""Data at scale, side by side in one run: `mixln-convert tokenize` throughput against the
tokenizer's own batch encode with the same N, peak memory of tokenizing at two corpus sizes, and
each rank's peak memory in a 2-process (gloo) training run on either tokenized folder.

    cd /tmp && apt-get download python3.11-doc && dpkg -x python3.11-doc_*.deb debdoc
    python benchmarks/data_scale.py --docs /tmp/debdoc/usr/share/doc --work /tmp/data-scale

The corpora repeat the documentation's text files (each copy of a document prefixed with its copy
number, so no two documents are equal) into JSON-lines files of `--sizes` GB. The tokenizer is
SmolLM2-135M's (from the cached GGUF), saved into a tiny random LLaMA that the training runs use.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

GB = 10**9
# Runs the CLI with argv and, at exit, writes this process's peak memory (VmHWM) to $PEAK_FILE.
PEAK = """
import atexit, os, sys
def peak():
    kib = int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0])
    open(os.environ["PEAK_FILE"] + "." + os.environ.get("RANK", "0"), "w").write(str(kib * 1024))
atexit.register(peak)
from mixln_convert.cli import main
sys.argv[0] = "mixln-convert"
main()
"""


def documents(docs: Path) -> list[str]:
    found = sorted(p for p in docs.rglob("*.txt") if p.is_file())
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in found]
    return [t for t in texts if t.strip()]


def build_corpus(texts: list[str], size: int, folder: Path) -> Path:
    """JSON-lines files of ~100 MB holding ``size`` bytes of text, the documents repeated."""
    if (folder / "done").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    written, copy, part = 0, 0, None
    while written < size:
        for text in texts:
            if part is None or part.tell() > 10**8:
                part = open(folder / f"part-{copy:05d}.jsonl", "w")
            line = json.dumps({"text": f"(copy {copy}) {text}"}) + "\n"
            part.write(line)
            written += len(line)
            if written >= size:
                break
        copy += 1
    part.close()
    (folder / "done").write_text("")
    return folder


def tiny_model(folder: Path) -> Path:
    """A tiny random LLaMA with SmolLM2's tokenizer (the training runs need a model, not a good one)."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from mixln_convert.fetch import smollm2_gguf
    from mixln_convert.io.loader import open_checkpoint

    tokenizer = open_checkpoint(smollm2_gguf()).tokenizer
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


BASELINE = """
import json, sys, time
from pathlib import Path
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
texts, size = [], 0
for path in sorted(Path(sys.argv[2]).glob("*.jsonl")):
    for line in open(path):
        texts.append(json.loads(line)["text"])
        size += len(texts[-1])
        if size >= int(sys.argv[3]):
            break
    if size >= int(sys.argv[3]):
        break
rates = {}
for name, encode in (("transformers tokenizer(texts)", lambda b: tokenizer(b, add_special_tokens=False)),
                     ("tokenizers encode_batch_fast", lambda b: tokenizer.backend_tokenizer.encode_batch_fast(b, add_special_tokens=False))):
    start = time.perf_counter()
    for i in range(0, len(texts), 1024):
        encode(texts[i:i + 1024])
    rates[name] = size / (time.perf_counter() - start)
print(json.dumps({"chars": size, "rates": rates}))
"""


def baseline(model: Path, corpus: Path, chars: int, n: int) -> dict:
    """The tokenizer's own batch encode with n threads (RAYON_NUM_THREADS), texts in memory."""
    env = {**os.environ, "RAYON_NUM_THREADS": str(n), "TOKENIZERS_PARALLELISM": "true"}
    done = subprocess.run([sys.executable, "-c", BASELINE, str(model), str(corpus), str(chars)], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def text_chars(corpus: Path) -> int:
    return sum(len(json.loads(line)["text"]) for path in sorted(corpus.glob("*.jsonl")) for line in open(path))


def measured(argv: list[str], peak_file: Path, env: dict | None = None) -> tuple[float, dict]:
    """Wall seconds of ``argv`` and the peak memory of each process it starts: {'main': ..., 'worker
    max': ...} from VmHWM of the processes running PEAK, and polled RSS of the others."""
    start = time.perf_counter()
    proc = psutil.Popen(argv, env={**os.environ, **(env or {}), "PEAK_FILE": str(peak_file)},
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    polled = {}
    while proc.poll() is None:
        try:
            for child in proc.children(recursive=True):
                polled[child.pid] = max(polled.get(child.pid, 0), child.memory_info().rss)
        except psutil.Error:
            pass
        time.sleep(0.2)
    seconds = time.perf_counter() - start
    out, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{err.decode()[-3000:]}")
    peaks = {p.name.rsplit(".", 1)[1]: int(p.read_text()) for p in peak_file.parent.glob(peak_file.name + ".*")}
    for p in peak_file.parent.glob(peak_file.name + ".*"):
        p.unlink()
    return seconds, {"peaks": peaks, "others_polled_max": max(polled.values(), default=0)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=Path, required=True, help="folder of documentation (its *.txt files)")
    parser.add_argument("--work", type=Path, required=True, help="folder for corpora and tokenized folders")
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.2, 2.0], help="corpus sizes, GB of text")
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--baseline-chars", type=int, default=50 * 10**6, help="text the baseline encodes")
    parser.add_argument("--train-only", action="store_true",
                        help="only the training runs, on the tokenized folders an earlier run left in --work")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    texts = documents(args.docs)
    print(f"{len(texts)} documents, {sum(map(len, texts)) / 1e6:.1f}M characters in {args.docs}")
    model = tiny_model(args.work / "tiny-smollm2")
    cli = [sys.executable, "-c", PEAK]
    peak_file = Path(tempfile.mkdtemp()) / "peak"
    script = peak_file.parent / "run_cli.py"  # torchrun starts a script file
    script.write_text(PEAK)
    for size in args.sizes:
        corpus = build_corpus(texts, int(size * GB), args.work / f"corpus-{size}GB")
        chars, tokens = text_chars(corpus), args.work / f"tokens-{size}GB"
        if not args.train_only:
            if size == args.sizes[0]:
                rates = baseline(model, corpus, args.baseline_chars, args.num_proc)
                for name, rate in rates["rates"].items():
                    print(f"baseline, {name}, {args.num_proc} threads, {rates['chars'] / 1e6:.0f}M chars in memory: "
                          f"{rate / 1e6:.2f}M chars/s")
            seconds, memory = measured([*cli, "tokenize", str(corpus), "--tokenizer", str(model), "--out", str(tokens),
                                        "--num-proc", str(args.num_proc), "--force"], peak_file)
            manifest = json.loads((tokens / "mixln-tokens.json").read_text())
            print(f"tokenize {size} GB ({chars / 1e6:.0f}M chars, {manifest['splits']['train']['tokens'] / 1e6:.0f}M train "
                  f"tokens, {manifest['splits']['validation']['tokens'] / 1e6:.1f}M validation), --num-proc "
                  f"{args.num_proc}: {seconds:.0f} s, {chars / seconds / 1e6:.2f}M chars/s end to end; peak RSS main "
                  f"{memory['peaks']['0'] / 2**20:.0f} MiB, workers {memory['others_polled_max'] / 2**20:.0f} MiB (polled)")
            before = {p.name: p.stat().st_mtime_ns for p in tokens.iterdir()}
            rerun, _ = measured([*cli, "tokenize", str(corpus), "--tokenizer", str(model), "--out", str(tokens),
                                 "--num-proc", str(args.num_proc)], peak_file)
            same = before == {p.name: p.stat().st_mtime_ns for p in tokens.iterdir()}
            print(f"  rerun on the same inputs: {rerun:.1f} s, {'nothing written' if same else 'FILES CHANGED'}")
        sets = [f"source={model}", f"data.train={tokens}", "data.validation=null", "seq_len=64", "micro_batch_size=2",
                "global_batch_size=4", f"max_tokens={8 * 4 * 64}", "data.eval_tokens=1024", "precision=fp32",
                "schedule.warmup_steps=1", "eval_interval=8", "checkpoint_interval=8"]
        run = args.work / f"train-{size}GB"
        shutil.rmtree(run, ignore_errors=True)
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
                str(script), "train", "smollm2-135m-cpu", *(f"--set={s}" for s in sets), "--arm", "preln",
                "--out", str(run)]
        seconds, memory = measured(argv, peak_file, {"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"})
        ranks = ", ".join(f"rank {r} {v / 2**20:.0f} MiB" for r, v in sorted(memory["peaks"].items()))
        print(f"  train on it, 2 processes (gloo), 8 steps of 4 x 64 tokens: {seconds:.0f} s; peak RSS {ranks}")


if __name__ == "__main__":
    main()
