#!/usr/bin/env bash
# Training throughput of both arms on one GPU in bf16, for the device tool's H200:
#   here, once:  .venv/bin/python benchmarks/gpu_sources.py tokenizer .gpu/tokenizer    (.gpu/ is git-ignored)
#   there:       run(command="bash benchmarks/gpu.sh", carry=[".gpu"], timeout_s=560)
# Builds random-init sources of two shapes (benchmarks/gpu_sources.py: SmolLM2-135M and a 1B-class
# LLaMA), converts each to Mix-LN (calibrated, alpha 0.25) and trains each arm STEPS steps of
# the shipped recipe smollm2-135m (64 x 2048 tokens a step, micro-batch 16, bf16 autocast, fp32 masters)
# on the embedded corpus. SmolLM2 keeps the recipe's heal (64k tokens, where the first GPU run hit a
# NaN at step 2); the 1B skips it. Each arm runs on its own, so one failing leaves the others' figures.
# Prints, per shape and arm, the median tokens/s after 3 warm-up steps and MFU = 6 x parameters x
# tokens/s / 790e12 (a measured H200 dense bf16 matmul rate; 6N counts every parameter, embeddings
# too, and leaves out attention's own FLOPs: the usual rough figure, not a profile); or the error.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
STEPS=${STEPS:-15}
SOURCES=${SOURCES:-smollm2-135m llama-1b}
# SETS="--set k=v ..." adds recipe overrides: a CPU smoke run is
#   SOURCES=smollm2-135m STEPS=4 SETS="--set seq_len=64 --set micro_batch_size=1 --set global_batch_size=2 --set max_tokens=512 --set heal.tokens=1024 --set data.eval_tokens=512" bash benchmarks/gpu.sh
WORK=$(mktemp -d)
OUT=${OUT:-$WORK}  # the device tool sets OUT: what is written there comes back
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PYTHON" -c 'import torch, transformers, accelerate; print("torch", torch.__version__, "transformers",
    transformers.__version__, "accelerate", accelerate.__version__)'
"$PYTHON" benchmarks/gpu_sources.py build .gpu/tokenizer "$WORK/sources" $SOURCES || exit 1

for shape in $SOURCES; do
    heal=65536; [ "$shape" = llama-1b ] && heal=0
    for arm in preln mixln; do
        start=$(date +%s)
        "$PYTHON" -m mixln_convert.cli train smollm2-135m --arm "$arm" --out "$WORK/$shape-$arm" \
            --set source="$WORK/sources/$shape" --set heal.tokens=$heal \
            --set data.train=null --set data.validation=null --set data.eval_tokens=65536 \
            --set max_tokens=$((STEPS * 64 * 2048)) --set schedule.warmup_steps=5 --set log_interval=1 \
            --set eval_interval=1000000 --set checkpoint_interval=1000000 --set grad_norm_interval=1 ${SETS:-} \
            2> "$OUT/$shape-$arm.log" || echo "$shape $arm failed: $(grep -a '^Error' "$OUT/$shape-$arm.log" | tail -1)"
        echo "$shape $arm: $(( $(date +%s) - start )) s wall"
        cp "$WORK/$shape-$arm/$arm/metrics.jsonl" "$OUT/$shape-$arm.metrics.jsonl" 2>/dev/null
    done
done

"$PYTHON" - "$WORK" <<'PY'
import json, statistics, sys
from pathlib import Path

for run in sorted(Path(sys.argv[1]).glob("*-*n/*n/summary.json")):
    summary = json.loads(run.read_text())
    records = [json.loads(line) for line in (run.parent / "metrics.jsonl").read_text().splitlines()]
    rate = statistics.median(r["tokens_per_s"] for r in records[3:])
    mfu = 6 * summary["parameters"] * rate / 790e12
    print(f"{run.parent.parent.name}: {rate:,.0f} tokens/s, MFU {mfu:.1%} ({summary['parameters'] / 1e6:.0f}M "
          f"parameters, {summary['precision']}, {summary['steps']} steps, loss {records[0]['loss']:.3f} -> "
          f"{records[-1]['loss']:.3f}, val ppl {summary['initial_val_ppl']:.1f} -> {summary['final_val_ppl']:.1f})")
PY
