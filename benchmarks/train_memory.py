"""The memory estimate (`mixln-convert estimate`, mixln_convert/training/memory.py) against one
training step measured on CPU, for a published shape with random weights (benchmarks/shapes.py):

    python benchmarks/train_memory.py [--shape smollm2-135m] [--batch-size 2] [--seq-len 256]

For fp32 and for CPU bf16 autocast (the casts GPU autocast makes too), in a fresh process each:
the bytes autograd saves in one forward with the loss (every distinct storage, parameters left
out, summed with ``torch.autograd.graph.saved_tensors_hooks``) beside the estimator's count; and
the peak RSS of the forward and backward of a second step above the resident weights and AdamW
state (VmHWM reset through /proc/self/clear_refs), beside the estimator's activations (with
autocast's weight copies); the gradients the backward writes come as the activations go, so they
add little to that peak.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from shapes import SHAPES  # benchmarks/shapes.py, beside this script


def child(shape: str, batch: int, seq_len: int, bf16: bool) -> dict:
    import torch

    from mixln_convert.runtime import map_large_allocations
    from shapes import random_model

    map_large_allocations()  # freed tensors leave the resident set, as in the CLI
    model = random_model(shape).train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq_len))
    autocast = lambda: torch.autocast("cpu", torch.bfloat16, enabled=bf16)  # noqa: E731
    saved = {}

    def pack(tensor):
        if tensor.untyped_storage().data_ptr() not in params:
            saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast():
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()  # the first step also creates AdamW's state
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    del loss
    resident = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    with autocast():
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return {"saved": sum(saved.values()), "peak_above_resident": _status("VmHWM") - resident}


def _status(key: str) -> int:
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(key + ":"))
    return int(line.split()[1]) * 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=SHAPES, default="smollm2-135m")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--child", choices=["fp32", "bf16"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.shape, args.batch_size, args.seq_len, args.child == "bf16")))
        return
    from transformers import LlamaConfig

    from mixln_convert.training.memory import activation_bytes, model_shapes, saved_bytes

    with tempfile.TemporaryDirectory() as folder:
        LlamaConfig(**SHAPES[args.shape]).save_pretrained(folder)
        shapes = model_shapes(folder)
    tokens = args.batch_size * args.seq_len
    print(f"{args.shape}, {shapes.parameters:,} parameters, {args.batch_size} x {args.seq_len} tokens; MB = 10^6 bytes")
    for precision, compute in (("fp32", 4), ("bf16", 2)):
        done = subprocess.run([sys.executable, __file__, "--shape", args.shape, "--batch-size", str(args.batch_size),
                               "--seq-len", str(args.seq_len), "--child", precision],
                              capture_output=True, text=True, check=True)
        measured = json.loads(done.stdout.splitlines()[-1])
        copies = 2 * shapes.matmul_parameters if compute == 2 else 0  # autocast's bf16 weight copies
        estimated = saved_bytes(shapes, tokens, compute) + copies
        peak = activation_bytes(shapes, tokens, compute, False) + copies
        print(f"{precision}: saved for backward {measured['saved'] / 1e6:.1f} MB measured, {estimated / 1e6:.1f} MB "
              f"estimated ({measured['saved'] / estimated:.3f}x); peak RSS of forward and backward above weights and "
              f"AdamW state {measured['peak_above_resident'] / 1e6:.1f} MB, estimated activations "
              f"{peak / 1e6:.1f} MB ({measured['peak_above_resident'] / peak:.3f}x)")


if __name__ == "__main__":
    main()
