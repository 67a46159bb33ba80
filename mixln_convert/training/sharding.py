"""Fully sharded data parallel training (torch's FSDP2) for the recipe key ``fsdp: true``: one unit per
decoder block and one for the rest, bf16 compute in a bf16 run, checkpoints saved shard by shard.

The trainer shards the model itself rather than through an accelerate FSDP config: the same code then
runs on CPU over gloo (accelerate enables FSDP only on GPUs), so the tests exercise the path GPUs take;
and each arm wraps its own model's blocks (accelerate keeps the first arm's FSDP plugin).
"""

from pathlib import Path

import torch

from ..architectures import model_blocks

SCHEDULE_STATE = "schedule.pt"  # beside the shards: the schedule's position


def shard(model, bf16: bool) -> None:
    """Shard ``model`` (a causal LM already on its device) over every process of the default group."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32)
    for layer in model_blocks(model):
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def sharded_state_dict(model) -> dict:
    """The whole model's state on the CPU of the main process (empty elsewhere); every process calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save_sharded(model, optimizer, scheduler, folder: Path, main: bool) -> None:
    """Each process writes its shards of the model and AdamW state into ``folder``; the main one the schedule."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(folder))
    if main:
        torch.save(scheduler.state_dict(), folder / SCHEDULE_STATE)


def load_sharded(model, optimizer, scheduler, folder: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    scheduler.load_state_dict(torch.load(folder / SCHEDULE_STATE, weights_only=True))
