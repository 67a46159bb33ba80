#!/usr/bin/env bash
# Training throughput of both arms on one GPU in bf16 (written for an H200; needs the repo and a
# Python environment with its dependencies):
#   bash benchmarks/gpu.sh                 # env: PYTHON, STEPS (30), SOURCE (smollm2), OUT (a temp folder)
# Converts SmolLM2-135M (recipes/smollm2-135m.yaml: 64 x 2048 tokens per step, micro-batch 16) and
# trains each arm STEPS steps on the embedded corpus, then prints the median tokens/s of the steps
# after the first 3 (warm-up) and MFU = 6 x parameters x tokens/s / 790e12, where 790 TFLOP/s is a
# measured H200 dense bf16 matmul rate; 6N counts every parameter (embeddings too) and leaves out
# attention's own FLOPs, so it is the usual rough figure, not a profile.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
STEPS=${STEPS:-30}
SOURCE=${SOURCE:-smollm2}
OUT=${OUT:-$(mktemp -d)/gpu-bench}

"$PYTHON" -m mixln_convert.cli train recipes/smollm2-135m.yaml --out "$OUT" \
    --set source="$SOURCE" --set data.train=null --set data.validation=null --set data.eval_tokens=65536 \
    --set max_tokens=$((STEPS * 64 * 2048)) --set schedule.warmup_steps=5 --set log_interval=1 \
    --set eval_interval=1000000 --set checkpoint_interval=1000000 --set grad_norm_interval=1000000

"$PYTHON" - "$OUT" <<'PY'
import json, statistics, sys
from pathlib import Path

out = Path(sys.argv[1])
for arm in ("mixln", "preln"):
    summary = json.loads((out / arm / "summary.json").read_text())
    records = [json.loads(line) for line in (out / arm / "metrics.jsonl").read_text().splitlines()]
    rate = statistics.median(r["tokens_per_s"] for r in records[3:])
    mfu = 6 * summary["parameters"] * rate / 790e12
    print(f"{arm}: {rate:,.0f} tokens/s, MFU {mfu:.1%} ({summary['parameters'] / 1e6:.1f}M parameters, "
          f"{summary['precision']}, {summary['steps']} steps, final loss {records[-1]['loss']:.3f})")
PY
