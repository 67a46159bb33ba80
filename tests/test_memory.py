"""The memory and compute estimate of a recipe (`mixln-convert estimate`): built from a config
alone, checked against the tensors autograd saves, and every shipped recipe fits the hardware
its comments state."""

import json

import pytest
import torch
from tiny import tiny_config
from transformers import LlamaForCausalLM

from mixln_convert.errors import MixLNError
from mixln_convert.training.memory import (Hardware, choose_hardware, estimate, estimate_recipe, model_shapes,
                                           saved_bytes, sized_for)
from mixln_convert.training.recipe import RECIPES, load_recipe, shipped_file, shipped_recipes

# Published shapes for the recipes whose sources are placeholders: LLaMA-1B as GaLore (and the
# Mix-LN paper after it) trained it, LLaMA-7B as released.
SHAPES = {
    "llama-1b": dict(hidden_size=2048, intermediate_size=5461, num_hidden_layers=24, num_attention_heads=32,
                     vocab_size=32000, max_position_embeddings=1024),
    "llama-7b-fsdp": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                          vocab_size=32000, max_position_embeddings=2048),
}


def config_only(folder, weights: str | None = None, **config):
    """A checkpoint folder with a config.json and no readable weights: none, or ``weights`` as the file's bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                                    **config}))
    if weights is not None:
        (folder / "model.safetensors").write_text(weights)
    return folder


def measured_saved_bytes(model, ids, bf16: bool) -> int:
    """Bytes of every distinct storage autograd saves in one forward with the loss, parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    autocast = torch.autocast("cpu", torch.bfloat16, enabled=bf16)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        model(input_ids=ids, labels=ids)
    return sum(saved.values())


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_activation_estimate_is_what_autograd_saves(bf16, tmp_path):
    """Within 10% (the terms left out: a float per norm and token, the token ids, RoPE's cos/sin)."""
    torch.manual_seed(0)
    config = tiny_config()
    config.save_pretrained(tmp_path)
    model = LlamaForCausalLM(config).train()
    ids = torch.randint(0, config.vocab_size, (2, 64))
    shapes = model_shapes(str(tmp_path))
    expected = saved_bytes(shapes, ids.numel(), 2 if bf16 else 4)
    if bf16:  # autocast's bf16 copies of the matmul weights, kept for the backward too
        expected += 2 * shapes.matmul_parameters
    assert 0.9 <= measured_saved_bytes(model, ids, bf16) / expected <= 1.1


@pytest.mark.parametrize("weights", [None, "not a safetensors file"], ids=["missing", "garbage"])
def test_estimate_reads_no_weights(weights, cli, tmp_path):
    source = config_only(tmp_path / "llama-1b", weights, **SHAPES["llama-1b"])
    result = cli("estimate", "llama-1b", "--set", f"source={source}", "--set", "data.train=null")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "1,339,082,752 parameters" in lines[0] and "8 x 80 GB GPU, ddp" in lines[1]  # the recipe's Sized for line
    assert any(line.startswith("| activations |") for line in lines)
    assert lines[-1].startswith("fits: ")


def test_the_source_is_resolved_as_train_resolves_it(cli, tmp_path):
    result = cli("estimate", "llama-1b", "--set", f"source={tmp_path / 'absent'}", "--set", "data.train=null")
    assert result.exit_code == 1 and "absent does not exist" in result.output
    result = cli("estimate", "llama-1b", "--set", f"source={config_only(tmp_path / 'bad', hidden_size=64)}",
                 "--set", "data.train=null")
    assert result.exit_code == 1 and "config.json: required key num_hidden_layers is missing" in result.output


@pytest.mark.parametrize("name", sorted(shipped_recipes()))
def test_shipped_recipes_fit_the_hardware_they_state(name, tmp_path, monkeypatch):
    """The GGUF of the smollm2 recipes gives its metadata and tensor table, never its tensors."""
    from mixln_convert.io.gguf import GGUFCheckpoint

    monkeypatch.setattr(GGUFCheckpoint, "get", lambda self, tensor: pytest.fail(f"read {tensor}"))
    hardware = sized_for(shipped_file(name))
    assert hardware is not None, f"{name}.yaml states no '# Sized for: ...' line"
    overrides = ["data.train=null"]
    if name in SHAPES:
        overrides.append(f"source={config_only(tmp_path / name, **SHAPES[name])}")
    recipe = load_recipe(name, overrides)
    result = estimate(recipe, hardware, model_shapes(recipe.source))
    assert result.fits(recipe.activation_checkpointing), (name, result.total(recipe.activation_checkpointing))


def test_estimate_recipe_is_the_estimate_of_the_recipe_on_its_hardware(tmp_path):
    """The API function `estimate` prints: the recipe and its overrides, the hardware it states with
    the options given over it, the source's shapes."""
    source = config_only(tmp_path / "7b", **SHAPES["llama-7b-fsdp"])
    overrides = [f"source={source}", "data.train=null"]
    recipe = load_recipe("llama-7b-fsdp", overrides)
    stated = sized_for(shipped_file("llama-7b-fsdp"))
    assert estimate_recipe("llama-7b-fsdp", overrides) == estimate(recipe, stated, model_shapes(str(source)))
    on_cpu = estimate_recipe("llama-7b-fsdp", overrides, processes=2, device="cpu", memory="24GiB")
    assert on_cpu.hardware == Hardware(2, stated.parallelism, "cpu", 24 * 2**30)
    with pytest.raises(MixLNError, match="^--memory: "):
        estimate_recipe("llama-7b-fsdp", overrides, memory="lots")


def test_the_7b_recipe_needs_activation_checkpointing(tmp_path):
    """~60-65 GB of activations per GPU without it (issue 33), on 80 GB cards."""
    source = config_only(tmp_path / "7b", **SHAPES["llama-7b-fsdp"])
    recipe = load_recipe("llama-7b-fsdp", [f"source={source}", "data.train=null"])
    result = estimate(recipe, sized_for(shipped_file("llama-7b-fsdp")), model_shapes(str(source)))
    assert recipe.activation_checkpointing and not result.fits(False) and result.fits(True)
    assert 60e9 <= result.activations[False] <= 65e9


def test_strategies_share_or_replicate_the_state(tmp_path):
    source = config_only(tmp_path / "tiny", **tiny_config().to_diff_dict())
    recipe = load_recipe(RECIPES / "smollm2-135m-cpu.yaml", [f"source={source}"])
    shapes = model_shapes(str(source))
    n = shapes.parameters
    single, ddp, fsdp = (estimate(recipe, Hardware(p, s, "gpu", 80 * 10**9), shapes)
                         for p, s in ((1, "single"), (4, "ddp"), (4, "fsdp")))
    assert single.state == {"weights (fp32 masters)": 4 * n, "gradients (fp32)": 4 * n, "AdamW moments (2 x fp32)": 8 * n,
                            "bf16 weight copies (autocast)": 2 * shapes.matmul_parameters}
    assert ddp.state["DDP gradient buckets (fp32)"] == 4 * n and ddp.activations == single.activations
    assert fsdp.state["AdamW moments (2 x fp32, 1/4 each)"] == 8 * n // 4
    assert single.flops == 6 * (n - shapes.lookup_parameters) * recipe.global_batch_size * recipe.seq_len
    cpu = estimate(recipe, Hardware(1, "single", "cpu", 8 * 10**9), shapes)  # precision auto: fp32 on CPU
    assert cpu.compute == 4 and cpu.activations[False] > single.activations[False]
    assert all(e.activations[True] < e.activations[False] for e in (single, cpu))


def test_hardware_flags_and_stated_hardware(tmp_path):
    stated = Hardware(1, "single", "gpu", 80 * 10**9)
    assert choose_hardware(stated, processes=8) == Hardware(8, "ddp", "gpu", 80 * 10**9)
    assert choose_hardware(None, memory="24GiB") == Hardware(1, "single", "gpu", 24 * 2**30)
    for kwargs, message in [(dict(processes=2, parallelism="single"), "--parallelism single runs one process"),
                            (dict(memory="lots"), "--memory: cannot read size 'lots'"),
                            (dict(memory="2000TB"), "--memory: 2000TB is more than 1 PiB"),
                            (dict(processes=10**6), "--processes: must be an integer in [1, 65536]")]:
        with pytest.raises(MixLNError, match=message.replace("[", r"\[")):
            choose_hardware(stated, **kwargs)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("# mine\n# Sized for: 4 x 141 GB GPUs, FSDP\nseq_len: 128\n# Sized for: 1 x 1 GB CPU\n")
    assert sized_for(recipe) == Hardware(4, "fsdp", "gpu", 141 * 10**9)
    recipe.write_text("seq_len: 128\n# Sized for: 4 x 141 GB GPUs, FSDP\n")  # not among the leading comments
    assert sized_for(recipe) is None
    recipe.write_text("# Sized for: 0 x 80 GB GPUs\n")
    with pytest.raises(MixLNError, match="r.yaml: '# Sized for: 0 x 80 GB GPUs': the processes must be"):
        sized_for(recipe)
