"""A causal LM run one decoder block at a time, and the per-layer metrics built on it.

The layer analyses need the residual stream at each block input and the output with some blocks
skipped: :class:`BlockRunner` takes the steps of transformers' ``LlamaModel.forward`` but can start
at any block and skip any (LLaMA and Mix-LN blocks take the same arguments).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..architectures import architecture_of_model, model_blocks
from ..evaluation.perplexity import Packed, window_nll


@dataclass
class Stream:
    """One batch run through the full model."""

    input_ids: torch.Tensor
    block_kwargs: dict  # causal mask and position embeddings, the same for every block
    residual: list[torch.Tensor]  # input of block 0..L-1, then the last block's output (before the final norm)


class BlockRunner:
    """Runs ``model`` (a transformers LLaMA or Mix-LN causal LM) block by block."""

    def __init__(self, model):
        self.model = model
        arch = architecture_of_model(model)
        self.decoder = arch.decoder_of(model)
        self.layers = arch.blocks_of(model)
        self.num_layers = len(self.layers)

    def embed(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """The embeddings of ``input_ids`` and the keyword arguments every block is called with."""
        from transformers.masking_utils import create_causal_mask

        hidden = self.decoder.embed_tokens(input_ids)
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        # no attention mask and no cache, given by position (transformers 5.17 names the cache past_key_values,
        # later releases cache); None where SDPA can use its own causal path
        mask = create_causal_mask(self.decoder.config, hidden, None, None, position_ids=position_ids)
        return hidden, {"attention_mask": mask, "position_ids": position_ids,
                        "position_embeddings": self.decoder.rotary_emb(hidden, position_ids=position_ids)}

    def run(self, hidden: torch.Tensor, block_kwargs: dict, start: int = 0, skip=frozenset()) -> torch.Tensor:
        """The residual stream after blocks ``start``..L-1 but those in ``skip``, from ``hidden``
        at the input of block ``start``."""
        for i in range(start, self.num_layers):
            if i not in skip:
                hidden = self.layers[i](hidden, **block_kwargs)
        return hidden

    def stream(self, input_ids: torch.Tensor) -> Stream:
        """Run the full model on ``input_ids`` and keep the residual stream at every block boundary."""
        hidden, kwargs = self.embed(input_ids)
        residual = [hidden]
        for layer in self.layers:
            residual.append(layer(residual[-1], **kwargs))
        return Stream(input_ids, kwargs, residual)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head's logits for the residual stream after the last block."""
        return self.model.lm_head(self.decoder.norm(hidden))

    def forward(self, input_ids: torch.Tensor, skip=frozenset()) -> torch.Tensor:
        """Logits of the model with the blocks in ``skip`` replaced by the identity."""
        hidden, kwargs = self.embed(input_ids)
        return self.logits(self.run(hidden, kwargs, skip=skip))

    def nll(self, hidden: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """Summed next-token negative log-likelihood of each row (as ``evaluate_perplexity`` scores it)."""
        return window_nll(self.logits(hidden), input_ids)

    def nll_without(self, stream: Stream, removed) -> torch.Tensor:
        """Summed NLL of the model with the blocks ``removed`` skipped, continuing from the stored
        input of the first removed block (the blocks before it are the full model's)."""
        removed = set(removed)
        first = min(removed)
        return self.nll(self.run(stream.residual[first], stream.block_kwargs, first, removed), stream.input_ids)


class RepresentationStatistics:
    """Token-averaged similarity of the residual stream between every pair of block boundaries
    (boundary k: the input of block k; boundary L: the last block's output before the final norm)."""

    def __init__(self, num_layers: int):
        self.num_layers = num_layers
        self.cos_sum = torch.zeros(num_layers + 1, num_layers + 1, dtype=torch.float64)
        self.angle_sum = torch.zeros_like(self.cos_sum)
        self.tokens = 0
        self.window_angles = []  # per evaluation window: the L angular distances of span 1

    def add(self, residual: list[torch.Tensor]) -> None:
        """Add one batch's stream (``residual``: L+1 tensors [batch, seq, hidden])."""
        batch, seq = residual[0].shape[:2]
        # float64: in float32 a vector's cosine with itself is 1 - 6e-8, an angle of 1e-4 * pi
        unit = F.normalize(torch.stack(residual).flatten(1, 2).double(), dim=-1)  # [L+1, tokens, hidden]
        cos = torch.einsum("itd,jtd->ijt", unit, unit).clamp(-1, 1)
        angle = torch.arccos(cos) / math.pi
        self.cos_sum += cos.sum(-1).cpu()
        self.angle_sum += angle.sum(-1).cpu()
        self.tokens += unit.shape[1]
        consecutive = torch.diagonal(angle, offset=1).T  # [L, tokens]: inputs of blocks l and l+1
        self.window_angles += consecutive.reshape(self.num_layers, batch, seq).mean(-1).T.tolist()

    def angular_distance_matrix(self) -> list[list[float]]:
        """Row l, entry n-1: mean arccos(cos(x_l, x_{l+n})) / pi for n = 1..L-l (Gromov et al. 2024)."""
        mean = self.angle_sum / self.tokens
        return [[mean[l, l + n].item() for n in range(1, self.num_layers - l + 1)] for l in range(self.num_layers)]

    def block_influence(self) -> list[float]:
        """1 - mean cos(input, output) of each block (ShortGPT)."""
        mean = self.cos_sum / self.tokens
        return [1 - mean[l, l + 1].item() for l in range(self.num_layers)]


@dataclass(frozen=True)
class Sweep(Packed):
    """The full model's scores and, per removal, the perplexity and window losses without those blocks."""
    removed: list[float]
    removed_window_losses: list[list[float]]


@torch.no_grad()
def removal_sweep(runner: BlockRunner, windows: torch.Tensor, removals=(), batch_size: int = 4,
                  statistics: RepresentationStatistics | None = None, progress: bool = True,
                  desc: str = "layer sweep") -> Sweep:
    """Perplexity of the full model and of the model with each set of blocks in ``removals`` skipped,
    in one pass over ``windows`` ([n, seq_len] token ids): each batch runs through the full model once,
    and each removal continues from the stored input of its first removed block rather than rerunning
    the blocks before it. Memory holds L+1 residual tensors of one batch; ``statistics``, if given,
    sees every batch's stream."""
    full, removed = [], [[] for _ in removals]  # summed NLL of each window
    batches = range(0, len(windows), batch_size)
    with tqdm(total=len(batches) * (1 + len(removals)), desc=desc, disable=not progress, leave=False) as bar:
        for start in batches:
            stream = runner.stream(windows[start:start + batch_size].to(runner.model.device))
            full += runner.nll(stream.residual[-1], stream.input_ids).tolist()
            if statistics is not None:
                statistics.add(stream.residual)
            bar.update()
            for k, removal in enumerate(removals):
                removed[k] += runner.nll_without(stream, removal).tolist()
                bar.update()
    scored = windows.shape[1] - 1
    tokens = len(full) * scored
    return Sweep(math.exp(sum(full) / tokens), sum(full) / tokens, tokens, [s / scored for s in full],
                 [math.exp(sum(r) / tokens) for r in removed], [[s / scored for s in r] for r in removed])


def grad_norm_per_layer(model, windows: torch.Tensor, batch_size: int = 4) -> list[list[float]]:
    """L2 norm of the LM-loss gradient of each block's parameters, one list per batch of ``batch_size``
    windows: one minibatch step's, as the paper's training-step norms are, and the spread across batches
    is what the report's uncertainty rests on. The parameters are left without gradients."""
    norms, layers = [], model_blocks(model)
    with torch.enable_grad():
        for start in range(0, len(windows), batch_size):
            model.zero_grad(set_to_none=True)
            batch = windows[start:start + batch_size].to(model.device)
            model(input_ids=batch, labels=batch, use_cache=False).loss.backward()
            norms.append([math.sqrt(sum(p.grad.float().pow(2).sum().item() for p in layer.parameters()
                                        if p.grad is not None)) for layer in layers])
    model.zero_grad(set_to_none=True)
    return norms
