"""Tried and dropped (see docs/measurements.md): refit one down_proj row of the last Post-LN block
so that its output can give position 0 the norm the first Pre-LN block needs.

    python benchmarks/calibration_dc_refit.py --paragraphs GLOB [--channel 507] [--ridge 1.0]

Channel 507 of SmolLM2-135M's residual stream holds ~+57 on every ordinary token and ~+700 on
position 0. A Post-LN block's output per token is gain * unit(z), so position 0 can only stand
out if ordinary tokens carry little of channel 507 in z and the gain is large. This fits (ridge
regression on the calibration split, toward the current row) the MLP's down_proj row of that
channel to cancel the constant for ordinary tokens, refits the output gains, and scores text B
per document (120 paragraphs) and text A packed (8,192 tokens in blocks of 512).
"""

import argparse
import math
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from heal_quality import paragraphs
from mixln_convert import convert
from mixln_convert.data import read_texts, token_blocks
from mixln_convert.fetch import smollm2_gguf
from mixln_convert.io.loader import open_checkpoint


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paragraphs", required=True)
    parser.add_argument("--channel", type=int, default=507)
    parser.add_argument("--ridge", type=float, default=1.0)
    args = parser.parse_args()
    gguf = smollm2_gguf()
    source = open_checkpoint(gguf)
    tok = source.tokenizer
    teacher = source.model()
    with tempfile.TemporaryDirectory() as tmp:
        student = open_checkpoint(convert(gguf, Path(tmp) / "c", alpha=0.25, progress=False)).model()
        text_a = Path(tmp) / "a.txt"
        text_a.write_text("".join(Path(f"/usr/share/common-licenses/{n}").read_text() for n in ("GPL-3", "Apache-2.0")))
        packed = token_blocks(tok, read_texts(str(text_a)), 512, 8192)
    docs = [torch.tensor([tok(d)["input_ids"][:512]]) for d in paragraphs(args.paragraphs)[:120]]
    cal = token_blocks(tok, read_texts(None, split="calibration"), 128, 8192)
    last = student.config.post_ln_layers - 1
    layer, c = student.model.layers[last], args.channel

    @torch.no_grad()
    def losses(model):
        doc = sum(F.cross_entropy(model(ids).logits[0, :-1], ids[0, 1:], reduction="sum").item() for ids in docs)
        pk = sum(F.cross_entropy(model(packed[i:i + 4]).logits[:, :-1].flatten(0, 1), packed[i:i + 4, 1:].flatten(),
                                 reduction="sum").item() for i in range(0, len(packed), 4))
        return doc, pk

    n_doc, n_packed = sum(ids.shape[1] - 1 for ids in docs), packed.numel() - len(packed)
    base = losses(teacher)

    def ratios(model):
        doc, pk = losses(model)
        return math.exp((doc - base[0]) / n_doc), math.exp((pk - base[1]) / n_packed)

    @torch.no_grad()
    def capture():
        seen = {}
        hooks = [layer.post_feedforward_layernorm.register_forward_pre_hook(lambda m, a: seen.setdefault("z", []).append(a[0])),
                 layer.mlp.register_forward_pre_hook(lambda m, a: seen.setdefault("h", []).append(a[0])),
                 layer.mlp.down_proj.register_forward_pre_hook(lambda m, a: seen.setdefault("act", []).append(a[0]))]
        targets = []
        for s in range(0, len(cal), 8):
            targets.append(teacher(cal[s:s + 8], output_hidden_states=True).hidden_states[last + 1])
            student(cal[s:s + 8])
        for h in hooks:
            h.remove()
        return torch.cat(targets).flatten(0, 1), {k: torch.cat(v).flatten(0, 1) for k, v in seen.items()}

    def stream_report(label, y, z, g):
        out = g * z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + student.config.rms_norm_eps)
        first = torch.zeros(len(y), dtype=torch.bool)
        first[::cal.shape[1]] = True
        print(f"{label}: position 0 RMS {out[first].pow(2).mean(-1).sqrt().mean():.1f} (original "
              f"{y[first].pow(2).mean(-1).sqrt().mean():.1f}), cosine to the original: position 0 "
              f"{F.cosine_similarity(out[first], y[first]).mean():.3f}, others {F.cosine_similarity(out[~first], y[~first]).mean():.3f}")
        return first

    print("before: per document %.3fx, packed %.3fx" % ratios(student))
    y, seen = capture()
    first = stream_report("before", y, seen["z"], layer.post_feedforward_layernorm.weight)
    with torch.no_grad():
        z, h, act = seen["z"], seen["h"], seen["act"]
        others = torch.ones(z.shape[1], dtype=torch.bool)
        others[c] = False
        gain = 1.2 * y[first, c].abs().mean().item() / z.shape[1] ** 0.5  # position 0 near one-hot on channel c
        target = y[:, c] * z[:, others].pow(2).mean(-1).sqrt() / gain - h[:, c]
        row = layer.mlp.down_proj.weight[c].clone()
        lam = args.ridge * act.pow(2).sum(0).mean()
        row += torch.linalg.solve(act.T @ act + lam * torch.eye(act.shape[1]), act.T @ (target - act @ row))
        layer.mlp.down_proj.weight[c] = row
        y, seen = capture()
        u = seen["z"] * torch.rsqrt(seen["z"].pow(2).mean(-1, keepdim=True) + student.config.rms_norm_eps)
        layer.post_feedforward_layernorm.weight.copy_((u * y).sum(0) / (u * u).sum(0))
    stream_report("after", y, seen["z"], layer.post_feedforward_layernorm.weight)
    print("after: per document %.3fx, packed %.3fx" % ratios(student))


if __name__ == "__main__":
    main()
