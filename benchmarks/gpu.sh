#!/usr/bin/env bash
# The whole mission at small scale in one run on one H200 (benchmarks/gpu_mission.py does it):
#   here, once:  bash benchmarks/gpu.sh --save-tokenizer .gpu/tokenizer   (.gpu/ is git-ignored, ~3.5 MB)
#   there:       bash benchmarks/gpu.sh   (with .gpu/ copied into the checkout; within 560 s)
#   CPU smoke:   bash benchmarks/gpu.sh --smoke [--tokenizer DIR]   (tiny scale; tests/test_gpu_script.py;
#                python -m benchmarks gpu --quick)
#   --real:      instead, SmolLM2-135M itself (benchmarks/gpu_real.py: its header has the plan, the budgets and
#                the two steps on the GPU machine, after `bash benchmarks/gpu.sh --real --prepare .gpu-real` here)
#   --throughput: instead, the trainer's speed at the 1B class (TinyLlama-1.1B's shape, random weights,
#                20 steps eager, 20 compiled) and a torch.profiler breakdown of an eager step (~3 min)
# Measured 2026-12-04: docs/training.md ("On one H200"), benchmarks/results/gpu*_2026-12-04/.
# No pip, no network: the machine's own torch/transformers/accelerate and the carried tokenizer.
# Phases, each a child process (estimates for the paper's LLaMA-130M shape, 160M parameters with
# SmolLM2's 49152-word vocabulary, 123M in matmuls, bf16 autocast, seq 1024, 64 x 1024 tokens a
# step, at an assumed ~150k tokens/s):
#   prepare   ~40 s  random-init source; ~80 MB of the machine's own Python source files as text
#                    (every 25th file held out for validation), tokenized with the carried tokenizer
#   pretrain ~120 s  `train --arm preln` from random weights, 12M tokens (192 steps), lr 1e-3:
#                    its final/ is the "pretrained" model
#   preln     ~75 s  the Pre-LN control: up to 12M tokens, capped at 60 s at the pre-training's
#                    measured rate, lr 3e-4
#   mixln     ~90 s  convert (calibrated, alpha 0.25: 3 of 12 blocks Post-LN), heal (1M tokens), then
#                    train on the same data, order and budget
#   analyze   ~60 s  layer drop, angular distance, gradient norms, pruning curve of the pretrained,
#                    converted, healed and both trained models (on the GPU, fp32, 32k tokens); compare
# ~6.5 min in all; children still running at 500 s are stopped, and optional phases (analysis, reruns)
# that would not end by then are skipped. On a non-finite loss or gradient (one line naming the
# step, first non-finite block and samples), that arm runs again to 5 steps past it in fp32 and
# with eager attention: which passes names the cause. Every failure keeps its full traceback in log.txt.
# $OUT (8 files at most): summary.txt and summary.json (every figure: tokens/s, the median of the
# trainer's CUDA-synchronized per-step rates; MFU as 6N/790 TFLOP/s measured and as (6N +
# attention)/989 TFLOP/s datasheet; peak GPU memory per arm against `estimate`; validation
# perplexity curves; layer drop and gradient norms per stage; the report's summary; phase times),
# log.txt, report.md, and the metrics.jsonl of up to 4 runs.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TQDM_DISABLE=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
"$PYTHON" -c 'import sys, torch, transformers, accelerate; print("python", sys.version.split()[0], "torch", torch.__version__,
    "transformers", transformers.__version__, "accelerate", accelerate.__version__)'
if [ "${1:-}" = --real ]; then
    shift
    exec "$PYTHON" benchmarks/gpu_real.py "$@"
fi
exec "$PYTHON" benchmarks/gpu_mission.py "$@"
