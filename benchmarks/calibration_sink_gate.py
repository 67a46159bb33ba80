import sys, torch, os
sys.path.insert(0, "/work/main/benchmarks")
import torch.nn.functional as F
from pathlib import Path
a = torch.load("/tmp/sink/acts.pt"); k = a["k"]; S_n = a["S_n"]; n = len(S_n) // 2
is0 = torch.zeros(S_n.shape[:2], dtype=torch.bool); is0[n:, 0] = True
X = S_n[~is0].double(); s = S_n[n, 0].double()
heldf = "/tmp/sink/heldout.pt"
if not Path(heldf).exists():
    from mixln_convert.fetch import smollm2_gguf
    from mixln_convert.io.loader import open_checkpoint
    from mixln_convert.data import token_blocks
    from heal_quality import paragraphs
    tok = open_checkpoint(smollm2_gguf()).tokenizer
    m = open_checkpoint("/tmp/sink/conv").model(); cap = []
    m.model.layers[k].mlp.register_forward_hook(lambda mod, i, o: cap.append(i[0][0]))
    texts_b = paragraphs("/tmp/debdoc/usr/share/doc/python3.11/html/_sources/**/*.txt")[:120]
    texts_a = [Path(f"/usr/share/common-licenses/{f}").read_text() for f in ("GPL-3", "Apache-2.0")]
    rnd = torch.randint(0, 49152, (8, 128), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for t in texts_b: m(torch.tensor([[1] + tok(t)["input_ids"][:255]]))
        hb = torch.cat([c[1:] for c in cap]); cap.clear()
        for blk in token_blocks(tok, texts_a, 256, 4096): m(torch.cat([torch.tensor([1]), blk])[None])
        ha = torch.cat([c[1:] for c in cap]); cap.clear()
        for r in rnd: m(torch.cat([torch.tensor([1]), r])[None])
        hr = torch.cat([c[1:] for c in cap]); cap.clear()
    torch.save(dict(B=hb, A=ha, R=hr), heldf)
held = torch.load(heldf)
scale = X.pow(2).mean().sqrt(); Xs, ss = X / scale, s / scale
cos = lambda Y: (Y.double() / Y.double().norm(dim=-1, keepdim=True)) @ (s / s.norm())
print("max cos to sink: calib %.3f B %.3f A %.3f random %.3f" % (cos(X).max(), cos(held["B"]).max(), cos(held["A"]).max(), cos(held["R"]).max()))
for lam in (1e-6, 1e-4, 1e-3, 1e-2, 1e-1, 1.0):
    w = torch.zeros_like(ss, requires_grad=True)
    opt = torch.optim.LBFGS([w], max_iter=1000, line_search_fn="strong_wolfe")
    def closure():
        opt.zero_grad(); l = lam * w.pow(2).sum() + torch.relu(1 + Xs @ w).pow(2).mean() + torch.relu(1 - ss @ w).pow(2); l.backward(); return l
    opt.step(closure); w = w.detach()
    r = lambda Y: ((Y.double() / scale) @ w / (ss @ w))
    gm = (ss @ w - (Xs @ w).max()) / w.norm()
    print("lam %g: calib max %.3f  B max %.3f  A max %.3f  random max %.3f  geometric margin %.3f (|s| %.1f)" % (
        lam, r(X).max(), r(held["B"]).max(), r(held["A"]).max(), r(held["R"]).max(), gm, ss.norm()))
