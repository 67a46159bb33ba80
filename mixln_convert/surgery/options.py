"""The pruning's settings (``mixln-convert prune``: surgery/prune.py). Torch-free."""

from dataclasses import dataclass

from ..analysis.options import METHODS, METHODS_HELP
from ..data.options import text
from ..errors import MixLNError
from ..evaluation.options import Measurement
from ..options import MAX_SHARD_SIZE, SEQ_LEN, ShardSized
from ..schema import TOKENS, Choice, Count, Size, Text, Window, setting


@dataclass(frozen=True, kw_only=True)
class PruneOptions(Measurement, ShardSized):
    """``mixln-convert prune``'s options (surgery/prune.py): the blocks ``layers`` names, or ``remove`` chosen."""
    data: str | None = text("Calibration text for --method angular/drop (default split: calibration).")
    seq_len: int = setting(SEQ_LEN, Window(), "Tokens per measured window.")
    max_tokens: int = setting(8 * SEQ_LEN, TOKENS, "Tokens measured for --method angular/drop.")
    layers: str | None = setting(None, Text(), "Blocks to remove (0-based), e.g. 20-23,27.", metavar="LIST")
    remove: int | None = setting(None, Count(1), "Number of blocks to remove, chosen by --method.", metavar="N")
    method: str = setting("angular", Choice(METHODS), "How --remove chooses its N blocks: " + METHODS_HELP)
    max_shard_size: str | int = setting(MAX_SHARD_SIZE, Size(), "Largest output shard, e.g. 5GB, 500MB.")

    def check_combination(self):
        if (self.layers is None) == (self.remove is None):
            raise MixLNError(f"{self.flag('layers')} and {self.flag('remove')}: give exactly one of them")
