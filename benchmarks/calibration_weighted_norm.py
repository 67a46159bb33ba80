"""Variants of the weighted Post-LN norm fit (a per-channel scale of the sum a Post-LN norm reads,
folded into the weights, so the norm divides by a weighted RMS): stream error and perplexity on
A (GPL-3 + Apache-2.0, 8,192 tokens, packed 512) and B (120 python3.11-doc paragraphs, per document).

    python benchmarks/calibration_weighted_norm.py base | w PENALTY none|rel
(as committed: the weighted fit in the last Post-LN block only; docs/measurements.md has every variant)"""
import json, sys, tempfile, time, torch
sys.path.insert(0, "/work/main/benchmarks")
from pathlib import Path
from heal_quality import paragraphs
from mixln_convert import convert
from mixln_convert.evaluate import score_checkpoint
from mixln_convert.fetch import smollm2_gguf
from mixln_convert.io.loader import open_checkpoint
from mixln_convert.architectures import architecture_for
from mixln_convert.data import read_texts, token_blocks
from mixln_convert.model.prefix import load_prefix
from mixln_convert.conversion import calibrate as C

tmp = Path(tempfile.mkdtemp())
B = tmp / "b.jsonl"
B.write_text("".join(json.dumps({"text": t}) + "\n" for t in paragraphs("/tmp/debdoc/usr/share/doc/python3.11/html/_sources/**/*.txt")[:120]))
A = tmp / "a.jsonl"
A.write_text("".join(json.dumps({"text": Path(f).read_text()}) + "\n" for f in ["/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0"]))
gguf = smollm2_gguf()
src = open_checkpoint(gguf)
arch = architecture_for(src.config, src.where)
blocks = token_blocks(src.tokenizer, read_texts(None, split="calibration"), 128, 8192, flag="x", source="e")
prefix = load_prefix(src, arch, 7, device="cpu")

def sc(ckpt):
    a = score_checkpoint(ckpt, data=A, seq_len=512, max_tokens=8192, per_document=False, progress=False)["perplexity"]
    b = score_checkpoint(ckpt, data=B, seq_len=512, max_tokens=16384, per_document=True, progress=False)["per_document"]["token_perplexity"]
    return a, b

def fit(z_batches, y_batches, eps, penalty=0.0, token_weight="none", steps=100):
    z = torch.cat([b.flatten(0, -2) for b in z_batches]).double()
    y = torch.cat([b.flatten(0, -2) for b in y_batches]).double()
    d = z.shape[-1]
    z2, zy = z * z, z * y
    pi = torch.ones(len(z), dtype=z.dtype) if token_weight == "none" else 1 / (y * y).mean(-1)
    pi = pi / pi.sum()
    y2 = (pi[:, None] * y * y).sum()
    logw = torch.zeros(d, dtype=z.dtype, requires_grad=True)
    def parts():
        lw = logw - logw.exp().mean().log()
        r = torch.rsqrt(z2 @ lw.exp() / d + eps)
        A_ = (pi * r) @ zy; B_ = (pi * r * r) @ z2
        return lw, r, A_, B_
    def objective():
        opt.zero_grad()
        lw, r, A_, B_ = parts()
        v = 1 - (A_ * A_ / B_.clamp_min(1e-300)).sum() / y2 + penalty * lw.pow(2).mean()
        v.backward(); return v
    opt = torch.optim.LBFGS([logw], lr=1, max_iter=steps, line_search_fn="strong_wolfe")
    with torch.enable_grad():
        opt.step(objective)
    with torch.no_grad():
        lw, r, _, _ = parts()
        # gain: unweighted per-channel least squares given the per-token scale
        gain = (r @ zy) / (r * r @ z2)
    return lw.exp().sqrt().float(), gain.float()

variant = sys.argv[1]
if variant != "base":
    pen, tw = float(sys.argv[2]), sys.argv[3]
    count = [0]
    def last_only(z, y, eps):
        count[0] += 1
        if count[0] == 13:  # the last block's post-feedforward norm
            return fit(z, y, eps, pen, tw)
        return torch.ones(z[0].shape[-1]), C._fit_gain([C._unit(b, eps) for b in z], y)
    C._fit_weighted_gain = last_only
else:
    C._fit_weighted_gain = lambda z, y, eps: (torch.ones(z[0].shape[-1]), C._fit_gain([C._unit(b, eps) for b in z], y))
t = time.time()
stats = C.calibrate(prefix, blocks, progress=False)
print(sys.argv[1:], "calibrate %.0f s" % (time.time() - t), "errors", " ".join("%.3f" % e for e in stats["relative_error"]), flush=True)
for i in range(7):
    a, b = stats["post_attention_scale"][i], stats["post_feedforward_scale"][i]
    print("  block", i, "a %.3g..%.3g b %.3g..%.3g" % (a.min(), a.max(), b.min(), b.max()))
stats = {**stats, "data": "embedded:calibration", "tokens": blocks.numel(), "seq_len": 128}
dst = tmp / "conv"
convert(gguf, dst, alpha=0.25, statistics=stats, progress=False)
ref = (21.40, None)
got = sc(dst)
print(sys.argv[1:], "A packed %.3f  B per-doc %.3f" % got, flush=True)
