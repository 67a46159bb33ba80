"""Where does the calibrated conversion lose, scored per document? Excess loss by position, and
what the first Pre-LN block would need from the Post-LN blocks to recover it.

    python benchmarks/calibration_gap.py
        --paragraphs '<python3.11-doc>/usr/share/doc/python3.11/html/_sources/**/*.txt'
        [--alpha 0.25] [--documents 120]

Converts the SmolLM2 GGUF (calibrated, defaults), then scores ``--documents`` of heal_quality.py's
text-B paragraphs one by one from their first token (up to 512 tokens each) with the original and
the converted model. Table 1: mean next-token loss per position bucket and that bucket's share of
the converted model's excess loss. Table 2: the converted model's per-document perplexity (over
the original's) when the residual stream entering its first Pre-LN block is patched from the
original's at the same point: a diagnosis, not a conversion.
"""

import argparse
import json
import math
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from heal_quality import paragraphs
from mixln_convert import convert
from mixln_convert.fetch import smollm2_gguf
from mixln_convert.io.loader import open_checkpoint

BUCKETS = [(0, 1), (1, 2), (2, 4), (4, 16), (16, 64), (64, 512)]


def _rescaled(x, norm_of):
    return x * norm_of.norm(dim=-1, keepdim=True) / x.norm(dim=-1, keepdim=True)


# patch name -> (student stream, original stream) -> stream the first Pre-LN block receives
PATCHES = {
    "none": lambda x, y: x,
    "position 0 from the original": lambda x, y: torch.cat([y[:, :1], x[:, 1:]], 1),
    "positions 0-3 from the original": lambda x, y: torch.cat([y[:, :4], x[:, 4:]], 1),
    "position 0: original's direction, converted norm": lambda x, y: torch.cat([_rescaled(y[:, :1], x[:, :1]), x[:, 1:]], 1),
    "position 0: original's direction, 3x converted norm": lambda x, y: torch.cat([3 * _rescaled(y[:, :1], x[:, :1]), x[:, 1:]], 1),
    "position 0: converted direction, original's norm": lambda x, y: torch.cat([_rescaled(x[:, :1], y[:, :1]), x[:, 1:]], 1),
    "every position: converted direction, original's norm": lambda x, y: _rescaled(x, y),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paragraphs", required=True, help="glob of .txt/.rst sources whose paragraphs are text B")
    parser.add_argument("--alpha", type=float, default=0.25)
    parser.add_argument("--documents", type=int, default=120)
    args = parser.parse_args()

    gguf = smollm2_gguf()
    source = open_checkpoint(gguf)
    tokenizer = source.tokenizer
    docs = [torch.tensor([tokenizer(d)["input_ids"][:512]]) for d in paragraphs(args.paragraphs)[:args.documents]]
    with tempfile.TemporaryDirectory() as tmp:
        converted = convert(gguf, Path(tmp) / "converted", alpha=args.alpha, progress=False)
        student = open_checkpoint(converted).model()
    teacher = source.model()
    boundary = student.config.post_ln_layers
    patch = {}

    def pre_hook(module, args_, kwargs):  # LlamaModel passes the stream positionally
        return (PATCHES[patch["name"]](args_[0], patch["original"]), *args_[1:]), kwargs

    student.model.layers[boundary].register_forward_pre_hook(pre_hook, with_kwargs=True)

    teacher_nll, streams = [], []
    with torch.no_grad():
        for ids in docs:
            out = teacher(ids, output_hidden_states=True)
            teacher_nll.append(F.cross_entropy(out.logits[0, :-1], ids[0, 1:], reduction="none"))
            streams.append(out.hidden_states[boundary])
        results = {}
        for name in PATCHES:
            patch["name"] = name
            nll = []
            for ids, stream in zip(docs, streams):
                patch["original"] = stream
                nll.append(F.cross_entropy(student(ids).logits[0, :-1], ids[0, 1:], reduction="none"))
            results[name] = nll

    tokens = sum(len(n) for n in teacher_nll)
    base = sum(n.sum().item() for n in teacher_nll)
    print(f"\nSmolLM2-135M-Instruct, alpha {args.alpha} ({boundary} Post-LN blocks), calibrated, no training; "
          f"{len(docs)} paragraphs of {args.paragraphs}, each scored from its first token ({tokens:,} predictions)\n")
    print("| positions | predictions | original loss | converted loss | share of the excess |\n| --- | --- | --- | --- | --- |")
    unpatched = results["none"]
    excess = sum(n.sum().item() for n in unpatched) - base
    for lo, hi in BUCKETS:
        t = sum(n[lo:hi].sum().item() for n in teacher_nll)
        s = sum(n[lo:hi].sum().item() for n in unpatched)
        count = sum(len(n[lo:hi]) for n in teacher_nll)
        print(f"| {lo}-{hi - 1} | {count:,} | {t / count:.2f} | {s / count:.2f} | {(s - t) / excess:.2f} |")
    print(f"\n| stream entering block {boundary} (the first Pre-LN one) | per-document perplexity, x original |\n| --- | --- |")
    for name, nll in results.items():
        print(f"| {name} | {math.exp((sum(n.sum().item() for n in nll) - base) / tokens):.3f}x |")
    print(json.dumps({"tokens": tokens, "patches": {k: math.exp((sum(n.sum().item() for n in v) - base) / tokens)
                                                    for k, v in results.items()}}))


if __name__ == "__main__":
    main()
