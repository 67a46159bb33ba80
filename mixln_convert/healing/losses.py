"""The distillation losses, one object each, chosen once before the heal's loop: called on a batch
of token ids, each runs the models it needs and returns the loss to backpropagate."""

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..architectures import architecture_of_model
from .options import KL_BLOCK_ELEMENTS, KL_CHUNK_TOKENS


class Residual:
    """``residual``: :func:`relative_error` of the stream the student's Post-LN blocks hand to the first Pre-LN
    block against the teacher's, per token (the few tokens with massive activations do not set the loss)."""

    whole_models = False  # the prefixes are enough

    def __init__(self, models):
        self.student, self.teacher = models.student_prefix, models.teacher_prefix
        self.runs_through = models.student_prefix  # the model whose blocks a step's forward and backward go through

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            target = self.teacher(input_ids=batch).last_hidden_state
        return relative_error(self.student(input_ids=batch).last_hidden_state, target)


class KL:
    """``kl``: :func:`distribution_kl` of the final next-token distributions; runs both whole models,
    several times the FLOPs of a ``residual`` step, but it is the loss that recovers perplexity: matching
    the stream at one depth does not pin down what the later blocks read from it."""

    whole_models = True

    def __init__(self, models):
        self.student, self.teacher = models.student_model, models.teacher_model
        self.runs_through = architecture_of_model(models.student_model).decoder_of(models.student_model)

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():  # the teacher's logits change with every batch: not cacheable, unlike its metrics
            target = self.teacher(input_ids=batch).logits
        return distribution_kl(self.student(input_ids=batch).logits, target)


class ChunkedKL(KL):
    """:class:`KL` with the logits too recomputed in the backward, a chunk of tokens at a time
    (:func:`chunked_kl`): with activation checkpointing they would otherwise set the peak."""

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            target = self.teacher.model(input_ids=batch).last_hidden_state
        return chunked_kl(self.student.model(input_ids=batch).last_hidden_state, target, self.student.lm_head,
                          self.teacher.lm_head)


def distillation_loss(name: str, activation_checkpointing: bool) -> type:
    """The loss class of ``--loss`` ``name`` (one of ``healing.options.LOSSES``)."""
    if name == "residual":
        return Residual
    return ChunkedKL if activation_checkpointing else KL


def relative_error(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """mean over tokens of |s_t - t_t|^2 / |t_t|^2 ([..., hidden] tensors)."""
    return ((student - teacher).pow(2).sum(-1) / teacher.pow(2).sum(-1)).mean()


def chunked_kl(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, student_head, teacher_head,
               chunk_tokens: int = KL_CHUNK_TOKENS) -> torch.Tensor:
    """:func:`distribution_kl` of ``student_head(student_hidden)`` against ``teacher_head(teacher_hidden)``,
    ``chunk_tokens`` positions at a time, each chunk's logits recomputed in the backward."""
    student_hidden, teacher_hidden = student_hidden.flatten(0, -2), teacher_hidden.flatten(0, -2)
    total = 0.0
    for start in range(0, len(student_hidden), chunk_tokens):
        chunk = slice(start, start + chunk_tokens)
        total = total + checkpoint(_kl_mean, student_hidden[chunk], teacher_hidden[chunk], student_head,
                                   teacher_head, 1 / len(student_hidden), use_reentrant=False)
    return total


def _kl_mean(student_hidden, teacher_hidden, student_head, teacher_head, scale: float) -> torch.Tensor:
    with torch.no_grad():
        target = teacher_head(teacher_hidden)
    return FusedKL.apply(student_head(student_hidden), target, scale)


def distribution_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) of the next-token distributions, averaged over tokens (the teacher's
    logits get no gradient)."""
    tokens = student_logits[..., 0].numel()
    return FusedKL.apply(student_logits.flatten(0, -2), teacher_logits.flatten(0, -2), 1 / tokens)


class FusedKL(torch.autograd.Function):
    """``scale`` x KL(teacher || student) summed over the rows of [tokens, vocab] logits, in float32, a few rows
    at a time, its gradient formed in the same pass. Autograd's log_softmax, kl_div and their backwards go over
    float32 copies of the whole [tokens, vocab] tensors a dozen times, which under bf16 cost more than the
    heads' matmuls (docs/measurements.md); a block of rows stays in cache, and one saved tensor replaces three."""

    @staticmethod
    def forward(ctx, student_logits: torch.Tensor, teacher_logits: torch.Tensor, scale: float) -> torch.Tensor:
        gradient = torch.empty_like(student_logits)
        total = torch.zeros((), dtype=torch.float32, device=student_logits.device)
        rows = max(1, KL_BLOCK_ELEMENTS // student_logits.shape[-1])
        for start in range(0, len(student_logits), rows):
            block = slice(start, start + rows)
            student = F.log_softmax(student_logits[block].float(), -1)
            teacher = F.log_softmax(teacher_logits[block].float(), -1)
            p = teacher.exp()
            total += teacher.sub_(student).mul_(p).sum()  # sum of p_t (log p_t - log p_s)
            gradient[block] = student.exp_().sub_(p).mul_(scale)
        ctx.save_for_backward(gradient)
        return total * scale

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (gradient,) = ctx.saved_tensors
        return gradient * grad_output, None, None
