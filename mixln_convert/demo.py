"""``mixln-convert demo``: the whole pipeline on the embedded default model and text.

SmolLM2-135M-Instruct (GGUF from PyPI) is converted (calibrated, alpha 0.25), both arms --
Mix-LN and the Pre-LN original -- get a short CPU budget of recovery training, every stage is
analyzed, and a report compares them. Each step is the function the corresponding command runs
(``train``, ``analyze``, ``compare``), so the demo is what a user would type, in order.
"""

import shutil
from pathlib import Path

from .analysis.analyze import analyze
from .fetch import cache_dir, smollm2_gguf
from .io.paths import check_destination
from .report import compare
from .training import load_recipe, train

RECIPE = "smollm2-135m-cpu"  # shipped with the package


DEMO_TRAIN_TOKENS = 8 * 4 * 256  # 8 optimizer steps of the CPU recipe per arm: minutes on 2 cores
DEMO_ANALYSIS_TOKENS = 2 * 256


def run_demo(out, *, alpha: float = 0.25, train_tokens: int = DEMO_TRAIN_TOKENS,
             analysis_tokens: int = DEMO_ANALYSIS_TOKENS,
             prune_curve: bool = True, force: bool = False) -> dict:
    """Run the pipeline into ``out``; returns the comparison (its ``summary`` sentences, ...)."""
    out = Path(out)
    check_destination(out, {"the model cache": cache_dir()}, force, flag="--out")
    if out.exists() and any(out.iterdir()):
        shutil.rmtree(out)
    overrides = [f"conversion.alpha={alpha}", f"max_tokens={train_tokens}", f"eval_interval={train_tokens // 1024}",
                 f"data.eval_tokens={analysis_tokens * 2}"]
    recipe = load_recipe(RECIPE, overrides)
    print(f"[1/4] source model: {smollm2_gguf()}")
    print(f"[2/4] convert + recovery training of both arms ({recipe['max_tokens']} tokens each) -> {out / 'train'}")
    train(recipe, out / "train")
    stages = {
        "original": smollm2_gguf(),
        "converted": out / "train" / "mixln" / "converted",
        "mixln-trained": out / "train" / "mixln" / "final",
        "preln-trained": out / "train" / "preln" / "final",
    }
    print(f"[3/4] layer analysis of {', '.join(stages)} ({analysis_tokens} tokens each)")
    for name, ckpt in stages.items():
        analyze(ckpt, out / "analysis" / name, max_tokens=analysis_tokens, prune_curve=prune_curve)
    print(f"[4/4] report -> {out / 'report'}")
    return compare([out / "analysis" / name for name in stages] + [out / "train"], out / "report",
                   labels=list(stages) + ["train"])
