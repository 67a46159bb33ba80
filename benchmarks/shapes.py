"""What the benchmarks build instead of fetching (this CPU machine reaches PyPI only, the GPU
machine nothing): published LLaMA-family shapes (the models' config.json values) with random
weights, as models in memory or as synthetic checkpoints on disk. A forward, training step or
conversion costs the same whatever the weights hold.
"""

import json
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
                         max_position_embeddings=8192),
    # the Mix-LN paper's LLaMA-130M (GaLore's llama_130m config), 32000 words
    "llama-130m": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                       num_key_value_heads=12, vocab_size=32000, max_position_embeddings=1024),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=320, max_position_embeddings=256),  # CPU smoke runs
    "tinyllama-1.1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                           num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048),
    "llama2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, vocab_size=32000, max_position_embeddings=2048),
}


def random_model(shape: str, seed: int = 0, **overrides) -> LlamaForCausalLM:
    """``LlamaForCausalLM`` of a published shape with transformers' own random initialization."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**{**SHAPES[shape], **overrides})).eval()


def random_weight(shape) -> torch.Tensor:
    """bf16 weights of a LLaMA's scale: linears ~ N(0, 0.02), norm gains around 1."""
    weight = 1 + 0.1 * torch.rand(shape) if len(shape) == 1 else 0.02 * torch.randn(shape)
    return weight.to(torch.bfloat16)


def synthetic_checkpoint(folder: Path, shape: str, max_shard_size: str) -> None:
    """An untied bf16 LLaMA checkpoint of ``shape`` with random weights in safetensors shards,
    written tensor by tensor (never a whole model in memory), with a byte-level BPE tokenizer."""
    from safetensors.torch import save_file

    from mixln_convert.limits import parse_size

    config = LlamaConfig(**{**SHAPES[shape], "tie_word_embeddings": False}, bos_token_id=1, eos_token_id=2,
                         dtype="bfloat16")
    with torch.device("meta"):  # names and shapes only
        shapes = {name: p.shape for name, p in LlamaForCausalLM(config).state_dict().items()}
    shards, shard_bytes, limit = [[]], 0, parse_size(max_shard_size)
    for name, size in shapes.items():
        if shards[-1] and shard_bytes + 2 * size.numel() > limit:
            shards, shard_bytes = shards + [[]], 0
        shards[-1].append(name)
        shard_bytes += 2 * size.numel()
    folder.mkdir(parents=True)
    weight_map = {}
    for k, names in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({name: random_weight(shapes[name]) for name in names}, folder / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, file))
    index = {"metadata": {"total_size": sum(2 * s.numel() for s in shapes.values())}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config.save_pretrained(folder)
    docstring_tokenizer(vocab_size=1024).save_pretrained(folder)


def docstring_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer trained on the embedded corpus (calibration needs one; for random
    weights any will do, as long as its ids fit the vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from mixln_convert.data import embedded_corpus

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    bpe.train_from_iterator(embedded_corpus("train")[:500], trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


if __name__ == "__main__" and sys.argv[1:2] == ["checkpoint"]:  # shapes.py checkpoint DIR SHAPE SHARD
    synthetic_checkpoint(Path(sys.argv[2]), sys.argv[3], sys.argv[4])
