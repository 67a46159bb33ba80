"""The files of an HF checkpoint folder that :mod:`.loader` reads and a Hub snapshot (:mod:`.hub`)
fetches. No imports: a Hub name is resolved before torch is."""

# (index, single file) of each weight format, in the order the loader prefers them
WEIGHT_FILES = (("model.safetensors.index.json", "model.safetensors"),
                ("pytorch_model.bin.index.json", "pytorch_model.bin"))
# Files beside the weights that a converted checkpoint needs too (tokenizer, generation defaults).
EXTRA_FILE_PATTERNS = (
    "tokenizer*", "special_tokens_map.json", "added_tokens.json", "generation_config.json",
    "vocab.*", "merges.txt", "chat_template*", "*.model", "LICENSE*",
)
# What transformers builds a tokenizer's vocabulary from (any one of them), and the file naming its class.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json with merges.txt")
TOKENIZER_CONFIG = "tokenizer_config.json"
# The model card: fetched with a Hub snapshot for the license it states (a converted model's card,
# io/model_card.py, carries it); never copied into an output, whose card is its own.
CARD_FILE = "README.md"
