"""The settings of ``mixln-convert tokenize`` (data/tokenization.py) and of the text a command reads. Torch-free."""

from dataclasses import dataclass

from ..errors import MixLNError
from ..limits import check_processes
from ..options import Options, Output
from ..schema import OPEN_FRACTION, TOKENS, Count, Text, same_as, setting

DATA_FORMATS = (".txt, .jsonl/.json/.json.gz (field 'text'), .parquet, a folder, a glob, or a Hugging Face Hub "
                "dataset ORG/NAME[:CONFIG[:SPLIT]][@REVISION] (column 'text', split train unless named). Default: "
                "the embedded corpus (general English and Python's standard-library docstrings).")


def text(help_text: str, default=None, **declared):
    """A text setting (--data and the like): a path, folder, glob or Hub dataset (DATA_FORMATS)."""
    return setting(default, Text(), f"{help_text} {DATA_FORMATS}", metavar="PATH", **declared)


@dataclass(frozen=True, kw_only=True)
class TokenizeOptions(Options):
    """``mixln-convert tokenize``'s options (data/tokenization.py)."""
    validation: str | None = setting(None, Text(), "Validation text (file, folder or glob); its documents are never "
                                     "trained on.", metavar="PATH", default_help="--validation-fraction of DATA's "
                                     "documents")
    validation_fraction: float = setting(0.01, OPEN_FRACTION, "Share of DATA's documents held out for "
                                         "validation, by content hash.")
    num_proc: int = setting(0, Count(0), "Tokenizing processes; 0: one per available core (none apart for text "
                            "under 16 MiB).")
    seq_len: int | None = setting(None, Count(1), "Training window length: shards are cut to whole windows of it "
                                  "(any window length still reads).")
    shard_tokens: int = setting(2**25, TOKENS, "Tokens per shard.")  # 32M tokens, 64 MiB of uint16

    def check_combination(self):
        if self.num_proc:
            check_processes(self.flag("num_proc"), self.num_proc)
        if self.seq_len is not None and self.seq_len > self.shard_tokens:
            raise MixLNError(f"{self.flag('seq_len')} {self.seq_len} is more than {self.flag('shard_tokens')} "
                             f"{self.shard_tokens}")


@dataclass(frozen=True, kw_only=True)
class TokenizeCommand(Output):
    """``mixln-convert tokenize``'s options beside TokenizeOptions: the tokenizer's checkpoint and TOKENS."""
    out: str = same_as(Output, "out", metavar="TOKENS")
    tokenizer_ckpt: str = setting(kind=Text(), help="The checkpoint (HF folder, .gguf or Hub id) whose tokenizer to "
                                  "use: the model you will train.", flag="--tokenizer", metavar="CKPT")
