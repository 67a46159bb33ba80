"""The memory and compute estimate of a recipe (`mixln-convert estimate`): built from a config
alone, checked against the tensors autograd saves (training) and a measured peak (the heal), and
every shipped recipe, its heal too, fits the hardware its comments state."""

import json

import pytest
import torch
from tiny import tiny_config
from transformers import LlamaForCausalLM

from mixln_convert.errors import MixLNError
from mixln_convert.training.memory import (Hardware, check_heal_fits, choose_hardware, estimate, estimate_recipe,
                                           heal_activation_bytes, model_shapes, report, saved_bytes, sized_for)
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
    heal = result.heal  # as the recipe states it: tokens, batch, loss and checkpointing read, not assumed
    assert (heal is None) == (recipe.heal.tokens == 0), name
    assert heal is None or heal.fits(heal.checkpointing), (name, heal.total(heal.checkpointing))


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


CPU = Hardware(1, "single", "cpu", 8 * 10**9)


def heal_recipe(tiny_llama, converted, *settings):
    """The CPU recipe healing ``converted`` against ``tiny_llama`` (a few steps of 4 x 128), with ``settings``."""
    items = dict(item.split("=", 1) for item in [f"source={tiny_llama}", f"converted={converted}", "heal.tokens=4096",
                                                 "heal.seq_len=128", *settings])  # a key given twice is refused
    return load_recipe(RECIPES / "smollm2-135m-cpu.yaml", [f"{key}={value}" for key, value in items.items()])


def heal_step_peak(recipe, profile_file) -> int:
    """Bytes a heal of ``recipe``'s heal section holds at its peak on CPU: its models' and AdamW's
    tensors, and the most that its second step (the first made AdamW's state) allocates on top, each
    allocation and free as torch's profiler records them. The step is HealRun.fit's."""
    from torch.profiler import ProfilerActivity, profile

    from mixln_convert.healing.losses import distillation_loss
    from mixln_convert.healing.options import HEAL_BETAS
    from mixln_convert.healing.pair import load_models, open_pair
    from mixln_convert.healing.run import _recomputing
    from mixln_convert.model.modeling_mixln import enable_checkpointing
    from mixln_convert.training.loop import adamw, parameter_groups

    heal, bf16 = recipe.heal, recipe.precision == "bf16"
    student, teacher = open_pair(recipe.converted, recipe.source)
    loss_class = distillation_loss(heal.loss, heal.activation_checkpointing)
    models = load_models(student, teacher, student.config["post_ln_layers"], torch.bfloat16 if bf16 else torch.float32,
                         "cpu", whole=loss_class.whole_models)
    objective = loss_class(models)
    if heal.activation_checkpointing:
        enable_checkpointing(objective.runs_through, {"use_reentrant": False})
    layers = models.student_prefix.layers
    optimizer = adamw(parameter_groups(layers, [], lr=1e-4, weight_decay=0.0), betas=HEAL_BETAS)
    torch.manual_seed(0)
    batch = torch.randint(0, student.config["vocab_size"], (heal.batch_size, heal.seq_len))

    def step():
        with (torch.autocast("cpu", torch.bfloat16, enabled=bf16),
              _recomputing(objective.runs_through.layers, heal.activation_checkpointing)):
            value = objective(batch)
        value.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # kernels' scratch buffers grow with the threads: the same peak on any machine
    try:
        step()
        tensors = [p for model in (models.student_model, models.teacher_model, models.student_prefix,
                                   models.teacher_prefix) if model is not None for p in model.parameters()]
        tensors += [t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
        held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}  # shared ones once
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiled:
            step()
    finally:
        torch.set_num_threads(threads)
    profiled.export_chrome_trace(str(profile_file))
    events = sorted((e for e in json.loads(profile_file.read_text())["traceEvents"] if e.get("name") == "[memory]"),
                    key=lambda e: e["ts"])
    allocated, peak = 0, 0
    for event in events:
        allocated += event["args"]["Bytes"]  # negative for a free
        peak = max(peak, allocated)
    return sum(held.values()) + peak


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["stored", "recomputed"])
@pytest.mark.parametrize("loss", ["kl", "residual"])
def test_heal_estimate_against_a_measured_peak(loss, checkpointing, precision, tiny_llama, converted, tmp_path):
    """Never below the peak, and at most 25% above it: the estimate counts the trained blocks'
    gradients (and bf16 copies) whole beside the activations' peak, where the backward has written
    some of them, or none (kl's peak is at its loss, in the forward); this tiny model's two trained
    blocks of eight make that a larger share than a real model's."""
    recipe = heal_recipe(tiny_llama, converted, f"heal.loss={loss}", f"heal.activation_checkpointing={checkpointing}",
                         f"precision={precision}")
    heal = estimate(recipe, CPU, model_shapes(str(tiny_llama))).heal
    assert heal.blocks == 2 and heal.compute == (2 if precision == "bf16" else 4)
    measured = heal_step_peak(recipe, tmp_path / "trace.json")
    assert 0.8 <= measured / heal.total(checkpointing) <= 1.0, (measured, heal.total(checkpointing))


def test_heal_counts_and_flops(tiny_llama, converted):
    """The heal's state by what each loss loads, its FLOPs, and no heal where nothing would run."""
    shapes = model_shapes(str(tiny_llama))
    n, n_k = shapes.parameters - shapes.lookup_parameters, 2 * shapes.block_parameters
    kl = estimate(heal_recipe(tiny_llama, converted), CPU, shapes).heal
    assert kl.state == {"frozen weights (fp32): teacher and student, whole, their common part once":
                        4 * shapes.parameters, "trained blocks (2): fp32 masters": 4 * n_k,
                        "gradients (fp32)": 4 * n_k, "AdamW moments (2 x fp32)": 8 * n_k}
    assert kl.steps == 4096 // (4 * 128) and kl.flops_per_token == 6 * n + 2 * n_k
    residual = estimate(heal_recipe(tiny_llama, converted, "heal.loss=residual", "heal.activation_checkpointing=true",
                                    "precision=bf16"), Hardware(4, "fsdp", "gpu", 80 * 10**9), shapes).heal
    assert residual.flops_per_token == 8 * n_k + 2 * n_k and residual.windows == (1, 4)
    assert residual.state["bf16 copies of the trained blocks (autocast)"] == 2 * n_k
    for settings in (["heal.tokens=0"], ["conversion.alpha=0.1"], ["arms=[preln]"]):
        recipe = load_recipe(RECIPES / "smollm2-135m-cpu.yaml", [f"source={tiny_llama}", *settings])
        assert estimate(recipe, CPU, shapes).heal is None, settings  # alpha 0.1 of 8 blocks: none Post-LN


def test_a_heal_that_does_not_fit_is_said_before_any_weight_is_loaded(tmp_path):
    """`estimate`'s last line, and check_heal_fits, for train to call before it loads the models: from
    the configs alone (the weights here are no safetensors)."""
    source = config_only(tmp_path / "source", "not a safetensors file", **tiny_config().to_diff_dict())
    converted = config_only(tmp_path / "converted", "not a safetensors file", post_ln_layers=2)
    big = heal_recipe(source, converted, "heal.batch_size=64", "heal.seq_len=256", "heal.tokens=16384")
    result = estimate(big, Hardware(1, "single", "cpu", 2 * 10**8), model_shapes(str(source)))
    assert result.fits(False) and not result.heal.fits(False) and result.heal.fits(True)
    lines = report(result).splitlines()
    assert "the first 2 of 8 blocks trained" in "\n".join(lines)
    assert lines[-1].startswith("does not fit: ") and "; the heal does not fit: " in lines[-1]
    assert lines[-1].endswith(f"heal.activation_checkpointing: false; with heal.activation_checkpointing: true it "
                              f"fits ({result.heal.total(True) / 1e9:.2f} GB)")
    with pytest.raises(MixLNError, match="^heal: does not fit: .* GB per process of 0.18 GB usable"):
        check_heal_fits(big, 1, memory=2 * 10**8)
    with pytest.raises(MixLNError, match="^heal.batch_size 64 is not a multiple of the 3 processes"):
        check_heal_fits(big, 3, memory=10**12)
    assert check_heal_fits(big, 2, memory=10**12).windows == (32, 64)


def test_a_sharded_heal_counts_two_models_in_shards(tiny_llama, converted):
    """fsdp: true (kl): each process holds 1/P of the student and of a whole teacher of its own, and gathers
    each model's root unit and two blocks; its loss is never chunked (the models are entered at their roots)."""
    shapes = model_shapes(str(tiny_llama))
    n_k = 2 * shapes.block_parameters
    recipe = heal_recipe(tiny_llama, converted, "fsdp=true", "heal.activation_checkpointing=true", "precision=fp32")
    heals = {p: estimate(recipe, Hardware(p, "fsdp", "gpu", 80 * 10**9), shapes).heal for p in (2, 4)}
    frozen = "frozen weights (fp32, 1/{}): the student's and the whole teacher's"
    for p, heal in heals.items():
        assert heal.state[frozen.format(f"{p} each")] == 4 * (2 * shapes.parameters - n_k) // p
        assert heal.state[f"AdamW moments (2 x fp32, 1/{p} each)"] == 8 * n_k // p
    unchunked = heal_activation_bytes(shapes, 2, heals[4].windows[0] * 128, 4, True, True, chunked=False)
    assert heals[4].activations[True] == unchunked > heal_activation_bytes(shapes, 2, heals[4].windows[0] * 128, 4,
                                                                          True, True)
