"""Tiny random LLaMA (and Mistral) checkpoints with a real (byte-level BPE) tokenizer, built offline."""

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, MistralForCausalLM, PreTrainedTokenizerFast

VOCAB = 320
TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Return a new list containing all items from the iterable in ascending order.",
    "A pretrained model whose first layers are Post-LN and whose deeper layers are Pre-LN.",
]


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TRAINING_TEXT, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


# The tiny shape, as keyword arguments any LLaMA-derived config (MixLNConfig too) accepts.
TINY_CONFIG = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                   bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)


def tiny_config(**overrides) -> LlamaConfig:
    return LlamaConfig(**{**TINY_CONFIG, **overrides})


FAMILIES = {"llama": LlamaForCausalLM, "mistral": MistralForCausalLM}  # name -> model class


def make_tiny_llama(folder: Path, seed: int = 0, norm_noise: float = 0.5, max_shard_size: str = "1GB",
                    family: str = "llama", **config_overrides) -> Path:
    """Save a random LLaMA (or another ``family``) whose norm gains are not all ones (so
    moving/folding them matters)."""
    torch.manual_seed(seed)
    model_class = FAMILIES[family]
    model = model_class(model_class.config_class(**{**TINY_CONFIG, **config_overrides}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.copy_(1 + norm_noise * torch.rand_like(p))
    model.save_pretrained(folder, max_shard_size=max_shard_size)
    tiny_tokenizer().save_pretrained(folder)
    return Path(folder)
