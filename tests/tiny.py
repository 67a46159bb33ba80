"""Tiny random LLaMA (and Mistral, Qwen2, Qwen3) checkpoints with a real (byte-level BPE) tokenizer, built
offline, Qwen GGUF files of them, and outputs run in plain transformers without this package."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (LlamaConfig, LlamaForCausalLM, MistralForCausalLM, PreTrainedTokenizerFast, Qwen2ForCausalLM,
                          Qwen3ForCausalLM)

VOCAB = 320
TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Return a new list containing all items from the iterable in ascending order.",
    "A pretrained model whose first layers are Post-LN and whose deeper layers are Pre-LN.",
]


def tiny_tokenizer(text: list[str] | None = None) -> PreTrainedTokenizerFast:
    """A byte-level BPE of VOCAB tokens learned from ``text`` (TRAINING_TEXT by default), GPT-2's split."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(text or TRAINING_TEXT, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


# The tiny shape, as keyword arguments any LLaMA-derived config (MixLNConfig too) accepts.
TINY_CONFIG = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                   bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)


def tiny_config(**overrides) -> LlamaConfig:
    return LlamaConfig(**{**TINY_CONFIG, **overrides})


FAMILIES = {"llama": LlamaForCausalLM, "mistral": MistralForCausalLM, "qwen2": Qwen2ForCausalLM,
            "qwen3": Qwen3ForCausalLM}  # name -> model class
# Qwen's tokenizer class adds <|endoftext|> to the tiny vocabulary: a Qwen model holds more
# embedding rows than its tokenizer has tokens, as Qwen's own checkpoints do.
QWEN_VOCAB = VOCAB + 16


def make_tiny_llama(folder: Path, seed: int = 0, norm_noise: float = 0.5, max_shard_size: str = "1GB",
                    family: str = "llama", **config_overrides) -> Path:
    """Save a random LLaMA (or another ``family``) whose norm gains (Qwen3's per-head q/k norms'
    too) are not all ones and whose biases (Qwen2's q/k/v) not zeros, so moving/folding them matters."""
    torch.manual_seed(seed)
    model_class = FAMILIES[family]
    qwen = family.startswith("qwen")
    vocab = {"vocab_size": QWEN_VOCAB} if qwen else {}
    model = model_class(model_class.config_class(**{**TINY_CONFIG, **vocab, **config_overrides}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + norm_noise * torch.rand_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder, max_shard_size=max_shard_size)
    tiny_tokenizer().save_pretrained(folder)
    if qwen:  # the class Qwen's checkpoints name; transformers would read a generic one as
        # Qwen2Tokenizer for a qwen2 config but as itself for a converted one
        path = Path(folder) / "tokenizer_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "tokenizer_class": "Qwen2Tokenizer"}))
    return Path(folder)


def write_tiny_gguf(folder: Path, arch, path: Path, head_dim: int | None = None, pre: str = "qwen2",
                    general: dict | None = None, q8_0: bool = False, tokenizer=None) -> Path:
    """The float32 single-shard checkpoint at ``folder`` (of :func:`make_tiny_llama`) as llama.cpp
    writes a Qwen GGUF: tensors by the GGUF names of ``arch`` (an architectures/*.json description),
    q/k rows in HF's order (Qwen's rope is llama.cpp's "neox"; LLaMA's would need permuting), the
    byte-level BPE tokenizer as a "gpt2" vocabulary; ``head_dim`` overrides attention.key_length, ``pre`` is its
    tokenizer.ggml.pre, ``general`` more general.* strings ({"general.license": "apache-2.0"}), ``q8_0`` stores
    the matrices quantized to Q8_0, ``tokenizer`` the vocabulary written (tiny_tokenizer()'s by default)."""
    from gguf import GGUFWriter, TokenType

    config = json.loads((Path(folder) / "config.json").read_text())
    state = load_file(Path(folder) / "model.safetensors")
    writer = GGUFWriter(path, arch.gguf_architecture)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(head_dim or config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_vocab_size(config["vocab_size"])
    vocabulary = json.loads((tokenizer or tiny_tokenizer()).backend_tokenizer.to_str())["model"]
    tokens = sorted(vocabulary["vocab"], key=vocabulary["vocab"].get)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    for key, value in (general or {}).items():
        writer.add_string(key, value)
    writer.add_token_list(tokens)
    writer.add_token_types([TokenType.CONTROL if t.startswith("<") and t.endswith(">") else TokenType.NORMAL
                            for t in tokens])
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in vocabulary["merges"]])
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    for gguf_name, name in arch.gguf_names(config["num_hidden_layers"]).items():
        if name in state:
            tensor = state[name].numpy()
            if q8_0 and tensor.ndim == 2:
                from gguf import GGMLQuantizationType, quantize

                writer.add_tensor(gguf_name, quantize(tensor, GGMLQuantizationType.Q8_0),
                                  raw_dtype=GGMLQuantizationType.Q8_0)
            else:
                writer.add_tensor(gguf_name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# Each folder loaded by plain transformers in a fresh process: refused without trust_remote_code,
# then loaded with it; {folder: its logits on the ids, or its 8 greedy tokens after them} saved.
WITHOUT_PACKAGE = textwrap.dedent("""
    import sys, torch
    from transformers import AutoModelForCausalLM
    what, ids, out, *folders = sys.argv[1:]
    ids, results = torch.load(ids), {}
    for folder in folders:
        try:
            AutoModelForCausalLM.from_pretrained(folder)
            print("LOADED WITHOUT trust_remote_code")
        except Exception as e:
            print("refused:", type(e).__name__)
        model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
        with torch.no_grad():
            if what == "generate":
                results[folder] = model.generate(ids, max_new_tokens=8, do_sample=False)
            else:
                results[folder] = model(input_ids=ids).logits
        print(type(model).__name__, type(model).__module__)
    assert "mixln_convert" not in sys.modules, "the package was imported"
    torch.save(results, out)
""")


def run_without_package(what: str, ids: torch.Tensor, folders: list, tmp_path: Path) -> tuple[str, dict]:
    """``what`` ("logits" or "generate") of each of ``folders`` on ``ids``, computed by plain
    transformers in a process that never imports this package: (its stdout, {folder: result})."""
    torch.save(ids, tmp_path / "ids.pt")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    # no stdin: transformers' y/N prompt (run remote code?) refuses
    run = subprocess.run([sys.executable, "-c", WITHOUT_PACKAGE, what, str(tmp_path / "ids.pt"),
                          str(tmp_path / "results.pt"), *map(str, folders)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout, torch.load(tmp_path / "results.pt")


def check_result_file(cls, written: Path, tmp_path: Path, path: list, value, error: str) -> None:
    """The result file ``written`` reads back as ``cls`` key for key, and a copy with the value at ``path`` (keys and
    list indices) replaced by ``value`` is refused with exactly ``error`` after its name."""
    import re

    import pytest
    from mixln_convert.errors import MixLNError

    text = written.read_text()
    assert json.dumps(cls.read(written).to_dict(), indent=2) + "\n" == text  # key for key
    damaged = target = json.loads(text)
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    (file := tmp_path / written.name).write_text(json.dumps(damaged))
    with pytest.raises(MixLNError, match="^" + re.escape(f"{file}: {error}") + "$"):
        cls.read(file)
