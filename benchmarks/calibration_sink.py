import sys, time, shutil, json
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
from mixln_convert import convert
from mixln_convert.fetch import smollm2_gguf
from mixln_convert.io.loader import open_checkpoint
from mixln_convert.evaluate import evaluate_documents, evaluate_perplexity
from mixln_convert.data import token_blocks
from heal_quality import paragraphs
gguf = smollm2_gguf(); tok = open_checkpoint(gguf).tokenizer
shutil.rmtree("/tmp/sink/new", ignore_errors=True)
t = time.time(); convert(gguf, "/tmp/sink/new", alpha=0.25, progress=False); print("convert %.1f s" % (time.time() - t))
print(json.load(open("/tmp/sink/new/config.json"))["mixln_provenance"]["calibration"]["sink_neuron"])
m = open_checkpoint("/tmp/sink/new").model()
texts_b = paragraphs("/tmp/debdoc/usr/share/doc/python3.11/html/_sources/**/*.txt")[:120]
texts_a = [Path(f"/usr/share/common-licenses/{f}").read_text() for f in ("GPL-3", "Apache-2.0")]
b = evaluate_documents(m, tok, texts_b, 512, progress=False)["token_perplexity"]
p = evaluate_perplexity(m, token_blocks(tok, texts_a, 512, 8192), progress=False)["perplexity"]
print("B per doc %.2f (x%.3f)  A packed %.2f (x%.3f)" % (b, b / 26.14, p, p / 21.71))
