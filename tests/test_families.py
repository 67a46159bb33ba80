"""Families beyond LLaMA's own blocks: Qwen2 (and Qwen2.5: q/k/v biases) and Qwen3 (per-head q/k
norms) convert, heal, train, analyze, prune and load like LLaMA; GGUF files of both read as
transformers reads them; a Llama-3.2-style source (tied head, llama3 rope) converts exactly."""

import json
import math
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny import TINY_CONFIG, make_tiny_llama, run_without_package, write_tiny_gguf
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from mixln_convert.conversion.converter import convert
from mixln_convert.model.modeling_mixln import MixLNForCausalLM, MixLNQwen2ForCausalLM, MixLNQwen3ForCausalLM
from mixln_convert.surgery.loading import load_model

L, N_POST = TINY_CONFIG["num_hidden_layers"], 2  # floor(0.25 * 8)
FAST = dict(calibration_tokens=1024, calibration_seq_len=64, progress=False)
# family -> (its transformers config and causal LM, the Mix-LN causal LM it converts to)
FAMILIES = {"qwen2": (Qwen2Config, Qwen2ForCausalLM, MixLNQwen2ForCausalLM),
            "qwen3": (Qwen3Config, Qwen3ForCausalLM, MixLNQwen3ForCausalLM)}
# the tensors of each family's blocks that LLaMA's lack
OWN_TENSORS = {"qwen2": {f"self_attn.{p}_proj.bias" for p in "qkv"},
               "qwen3": {"self_attn.q_norm.weight", "self_attn.k_norm.weight"}}
IDS = torch.randint(3, TINY_CONFIG["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(0))
MIXLN_KEYS = ("post_ln_layers", "layernorm_scaling", "alpha", "mixln_provenance", "auto_map")


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    return {k: v for f in sorted(Path(folder).glob("*.safetensors")) for k, v in load_file(f).items()}


def config_of(folder: Path) -> dict:
    return json.loads((Path(folder) / "config.json").read_text())


@torch.no_grad()
def logits(model_or_folder, ids=IDS) -> torch.Tensor:
    model = model_or_folder if isinstance(model_or_folder, torch.nn.Module) else load_model(model_or_folder)
    return model(input_ids=ids).logits


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """A tiny random checkpoint per family whose config.json reads like the released models': a
    sliding_window size given, but use_sliding_window false (and layer_types, as transformers 5 saves it)."""
    root, folders = tmp_path_factory.mktemp("sources"), {}
    for name in FAMILIES:
        folder = folders[name] = make_tiny_llama(root / name, family=name)
        (folder / "config.json").write_text(json.dumps({**config_of(folder), "sliding_window": 32768,
                                                        "use_sliding_window": False}))
    return folders


@pytest.fixture(scope="module")
def conversions(sources, tmp_path_factory) -> dict[str, Path]:
    """Each source converted with the default (calibrated) strategy at alpha 0.25: 2 Post-LN blocks."""
    root = tmp_path_factory.mktemp("converted")
    return {name: convert(source, root / name, alpha=0.25, **FAST) for name, source in sources.items()}


@pytest.fixture(params=list(FAMILIES))
def family(request) -> str:
    return request.param


@pytest.fixture
def source(family, sources) -> Path:
    return sources[family]


@pytest.fixture
def converted(family, conversions) -> Path:
    return conversions[family]


# ---- conversion ------------------------------------------------------------------------------


def test_alpha_zero_reproduces_the_source_exactly(family, source, tmp_path):
    out = convert(source, tmp_path / "alpha0", alpha=0.0, **FAST)
    model = load_model(out)
    assert type(model) is FAMILIES[family][2] and model.config.post_ln_layers == 0
    assert torch.equal(logits(model), logits(source))


def test_llama32_style_source_converts_exactly_at_alpha_zero(tmp_path):
    """Llama 3.2: tied embeddings and the llama3 rope scaling (in its config.json's own keys:
    rope_scaling, rope_theta), both carried over as they are."""
    source = make_tiny_llama(tmp_path / "llama32", tie_word_embeddings=True)
    config = {k: v for k, v in config_of(source).items() if k != "rope_parameters"}
    rope = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}
    (source / "config.json").write_text(json.dumps({**config, "rope_scaling": rope, "rope_theta": 500000.0}))
    out = convert(source, tmp_path / "alpha0", alpha=0.0, **FAST)
    converted = config_of(out)
    assert converted["tie_word_embeddings"] and "lm_head.weight" not in tensors(out)
    assert {k: converted["rope_scaling"][k] for k in rope} == rope and converted["rope_theta"] == 500000.0
    model = load_model(out)
    assert type(model) is MixLNForCausalLM
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    head_dim = TINY_CONFIG["hidden_size"] // TINY_CONFIG["num_attention_heads"]
    unscaled = 1 / 500000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim)
    assert not torch.allclose(model.model.rotary_emb.inv_freq, unscaled)  # the llama3 scaling is in effect
    assert torch.equal(logits(model), logits(source))


def reference_logits(folder: Path, family: str, ids=IDS) -> torch.Tensor:
    """The converted checkpoint at ``folder`` run by hand with the family's own transformers
    classes (a plain model of its config holding its tensors): Post-LN in the first blocks,
    h = N_pa(x + A(x)), out = N_pf(h + M(h)) with N_pf a norm of the family's own class; Pre-LN
    in the rest, h = x + A(N_in(x)), out = h + M(N_pa(h)) (/work/shared/MIXLN.md)."""
    config_class, model_class, _ = FAMILIES[family]
    config = {k: v for k, v in config_of(folder).items() if k not in MIXLN_KEYS}
    n_post = config_of(folder)["post_ln_layers"]
    model = model_class(config_class(**{**config, "model_type": family})).eval()
    state = tensors(folder)
    post_ff = {i: state.pop(f"model.layers.{i}.post_feedforward_layernorm.weight") for i in range(n_post)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert sorted(missing) == [f"model.layers.{i}.input_layernorm.weight" for i in range(n_post)] and not unexpected
    inner = model.model
    x = inner.embed_tokens(ids)
    rotary = inner.rotary_emb(x, torch.arange(ids.shape[1])[None])
    causal = torch.full((ids.shape[1], ids.shape[1]), float("-inf")).triu(1)[None, None]

    def attention(layer, h):
        return layer.self_attn(hidden_states=h, attention_mask=causal, position_embeddings=rotary)[0]

    with torch.no_grad():
        for i, layer in enumerate(inner.layers):
            if i < n_post:
                norm = type(layer.post_attention_layernorm)(config["hidden_size"], eps=config["rms_norm_eps"])
                norm.weight.copy_(post_ff[i])
                h = layer.post_attention_layernorm(x + attention(layer, x))
                x = norm(h + layer.mlp(h))
            else:
                h = x + attention(layer, layer.input_layernorm(x))
                x = h + layer.mlp(layer.post_attention_layernorm(h))
        return model.lm_head(inner.norm(x))


def test_conversion_equals_a_post_ln_pre_ln_forward_of_the_familys_own_classes(family, converted):
    model = load_model(converted)
    assert type(model) is FAMILIES[family][2] and model.config.post_ln_layers == N_POST
    assert [layer.is_post_ln for layer in model.model.layers] == [i < N_POST for i in range(L)]
    torch.testing.assert_close(logits(model), reference_logits(converted, family), rtol=1e-5, atol=1e-5)


def at_rms(x: torch.Tensor, scale: float, eps: float) -> torch.Tensor:
    """``x`` with every token rescaled so that an RMSNorm of epsilon ``eps`` divides it by ``scale``."""
    return x / x.pow(2).mean(-1, keepdim=True).sqrt() * (scale ** 2 - eps) ** 0.5


def test_calibrated_conversion_folds_the_gains_and_leaves_the_biases(family, source, converted):
    """Each Post-LN block's q/k/v (and gate/up) compute, on a token at the calibrated RMS, exactly
    what the source's do on that token's Pre-LN norm output: the gain is folded into the weight's
    input columns, and the bias (Qwen2), added after the product, stays as it is; so do the
    per-head q/k norms (Qwen3) and o_proj/down_proj."""
    before, after = tensors(source), tensors(converted)
    calibration = config_of(converted)["mixln_provenance"]["calibration"]
    for i in range(N_POST):
        prefix = f"model.layers.{i}."
        assert {n.removeprefix(prefix) for n in after if n.startswith(prefix)} >= OWN_TENSORS[family]
        for name in OWN_TENSORS[family] | {"self_attn.o_proj.weight", "mlp.down_proj.weight"}:
            assert torch.equal(after[prefix + name], before[prefix + name]), prefix + name
        for names, norm, scale in ((["q", "k", "v"], "input_layernorm", "input_scale"),
                                   (["gate", "up"], "post_attention_layernorm", "mid_scale")):
            fold = before[prefix + norm + ".weight"] / calibration[scale][i]
            for p in names:
                module = "self_attn" if p in "qkv" else "mlp"
                name = f"{prefix}{module}.{p}_proj.weight"
                torch.testing.assert_close(after[name], before[name] * fold, rtol=1e-6, atol=0, msg=name)

    source_model = load_model(source)
    original, mixln = source_model.model.layers[0], load_model(converted).model.layers[0]
    eps = source_model.config.rms_norm_eps
    x = at_rms(torch.randn(1, 16, TINY_CONFIG["hidden_size"], generator=torch.Generator().manual_seed(1)),
               calibration["input_scale"][0], eps)
    rope = source_model.model.rotary_emb(x, torch.arange(16)[None])
    with torch.no_grad():
        for p in ("q", "k", "v"):
            expected = getattr(original.self_attn, f"{p}_proj")(original.input_layernorm(x))
            torch.testing.assert_close(getattr(mixln.self_attn, f"{p}_proj")(x), expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(mixln.self_attn(hidden_states=x, attention_mask=None, position_embeddings=rope)[0],
                                   original.self_attn(hidden_states=original.input_layernorm(x), attention_mask=None,
                                                      position_embeddings=rope)[0], rtol=1e-4, atol=1e-5)
        h = at_rms(x, calibration["mid_scale"][0], eps)
        torch.testing.assert_close(mixln.mlp(h), original.mlp(original.post_attention_layernorm(h)),
                                   rtol=1e-4, atol=1e-5)


def test_reinitialized_blocks_get_zero_biases_and_unit_head_norms(family, source, tmp_path):
    """As transformers initializes them; the Pre-LN blocks keep the source's."""
    before = tensors(source)
    after = tensors(convert(source, tmp_path / "reinit", alpha=0.25, strategy="reinit-post", progress=False))
    for i in range(L):
        for name in (f"model.layers.{i}.{n}" for n in OWN_TENSORS[family]):
            fresh = torch.zeros_like(before[name]) if name.endswith(".bias") else torch.ones_like(before[name])
            assert torch.equal(after[name], fresh if i < N_POST else before[name]), name
            assert not torch.equal(before[name], fresh), name  # the source's are random: the test can tell


# ---- loading in plain transformers -------------------------------------------------------------


def test_the_output_loads_with_remote_code_in_a_fresh_process_and_generates(conversions, tmp_path):
    prompt = IDS[:1, :6]
    stdout, generated = run_without_package("generate", prompt, list(conversions.values()), tmp_path)
    assert stdout.count("refused:") == len(conversions), stdout  # never silently the plain family
    for name, folder in conversions.items():
        assert f"{FAMILIES[name][2].__name__} transformers_modules." in stdout, stdout
        model = load_model(folder)
        expected = model.generate(prompt, max_new_tokens=8, do_sample=False)
        assert expected.shape[1] == prompt.shape[1] + 8 and torch.equal(generated[str(folder)], expected), name


# ---- heal, train, analyze, prune ----------------------------------------------------------------


def test_heal_changes_only_the_post_ln_blocks(family, source, converted, tmp_path):
    from mixln_convert.healing import heal

    out = tmp_path / "healed"
    result = heal(converted, source, out, tokens=4 * 2 * 32, seq_len=32, batch_size=2, eval_tokens=128,
                  lr=0.05, loss="residual", perplexity=False, progress=False)
    assert result.steps == 4 and math.isfinite(result.relative_error.after)
    before, after = tensors(converted), tensors(out)
    assert before.keys() == after.keys()
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all(n.startswith(tuple(f"model.layers.{i}." for i in range(N_POST))) for n in changed)
    assert type(load_model(out)) is FAMILIES[family][2]


def test_training_runs_and_saves_the_familys_mix_ln_model(family, source, tmp_path):
    from mixln_convert.workflows.train import train
    from mixln_convert.training import load_recipe

    words, rng = "the of model layer norm residual stream token block attention quick brown fox".split(), random.Random(0)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": " ".join(rng.choices(words, k=60)) + "."}) + "\n" for _ in range(100)))
    sets = {"source": source, "data.train": corpus, "data.validation": "null", "seq_len": 32,
            "micro_batch_size": 2, "global_batch_size": 2, "max_tokens": 2 * 2 * 32, "data.eval_tokens": 64,
            "precision": "fp32", "schedule.warmup_steps": 1, "eval_interval": 2, "checkpoint_interval": 2,
            "grad_norm_interval": 2, "conversion.strategy": "move", "heal.tokens": 0}
    recipe = load_recipe("smollm2-135m-cpu", [f"{k}={v}" for k, v in sets.items()])
    summary = train(recipe, tmp_path / "run", arms=("mixln",), progress=False)["mixln"]
    assert summary.steps == 2 and math.isfinite(summary.final_val_loss)
    model = load_model(tmp_path / "run" / "mixln" / "final")
    assert type(model) is FAMILIES[family][2] and model.config.post_ln_layers == N_POST
    assert model._no_split_modules == {type(model.model.layers[0]).__name__}  # the blocks FSDP wraps


def test_analysis_runs_the_blocks_as_the_model_does(converted):
    from mixln_convert.analysis.layers import BlockRunner

    model = load_model(converted)
    for attention in ("sdpa", "eager"):  # eager gets an explicit mask from create_causal_mask
        model.set_attn_implementation(attention)
        with torch.no_grad():
            assert torch.equal(BlockRunner(model).forward(IDS), logits(model)), attention


def test_pruned_checkpoint_equals_skipping_the_blocks(family, converted, tmp_path):
    from mixln_convert.analysis.layers import BlockRunner
    from mixln_convert.surgery.prune import prune

    assert len(config_of(converted)["layer_types"]) == L  # one attention kind per block, which pruning must cut
    out = prune(converted, tmp_path / "pruned", layers="1,5", progress=False)
    config = config_of(out)
    assert config["num_hidden_layers"] == L - 2 and config["post_ln_layers"] == N_POST - 1
    assert len(config["layer_types"]) == L - 2
    model = load_model(out)
    assert type(model) is FAMILIES[family][2]
    with torch.no_grad():
        assert torch.equal(logits(model), BlockRunner(load_model(converted)).forward(IDS, skip={1, 5}))


# ---- GGUF --------------------------------------------------------------------------------------


def test_a_gguf_reads_as_transformers_reads_it_and_converts_exactly(family, source, tmp_path):
    from transformers import AutoModelForCausalLM

    from mixln_convert.io.loader import open_checkpoint

    arch = open_checkpoint(source).arch
    gguf = write_tiny_gguf(source, arch, tmp_path / f"{family}.gguf")
    reference = logits(source)
    read = open_checkpoint(gguf)
    assert read.arch is arch and set(read.names()) == set(tensors(source))
    assert all(torch.equal(read.get(name), tensor) for name, tensor in tensors(source).items())
    transformers_own = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=gguf.name).eval()
    assert torch.equal(logits(transformers_own), reference)  # the file is what transformers reads it as
    assert torch.equal(logits(gguf), reference)
    out = convert(gguf, tmp_path / "alpha0", alpha=0.0, **FAST)
    assert type(load_model(out)) is FAMILIES[family][2] and torch.equal(logits(out), reference)


def test_a_gguf_linked_to_a_blob_without_a_suffix_reads_as_gguf(sources, tmp_path):
    """The Hugging Face cache holds a GGUF as snapshots/REV/NAME.gguf, a link to blobs/HASH."""
    from mixln_convert.io.gguf import GGUFCheckpoint
    from mixln_convert.io.loader import open_checkpoint

    source = sources["qwen2"]
    (tmp_path / "blobs").mkdir()
    blob = write_tiny_gguf(source, open_checkpoint(source).arch, tmp_path / "blobs" / "9f2c41d0")
    link = tmp_path / "snapshots" / "main" / "model.gguf"
    link.parent.mkdir(parents=True)
    link.symlink_to(blob)
    read = open_checkpoint(link)
    assert isinstance(read, GGUFCheckpoint) and set(read.names()) == set(tensors(source))
    out = convert(link, tmp_path / "alpha0", alpha=0.0, **FAST)
    assert torch.equal(logits(out), logits(source))


def _llama_gguf(path: Path, state: dict, kv_heads: int | None) -> Path:
    """A 1-block LLaMA GGUF of ``state`` (GGUF names), attention.head_count_kv left out when None."""
    from gguf import GGUFWriter

    writer = GGUFWriter(path, "llama")
    for add, value in ((writer.add_block_count, 1), (writer.add_embedding_length, 8),
                       (writer.add_feed_forward_length, 16), (writer.add_head_count, 2), (writer.add_context_length, 64),
                       (writer.add_vocab_size, 32)):
        add(value)
    if kv_heads is not None:
        writer.add_head_count_kv(kv_heads)
    for name, values in state.items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_llama_gguf_without_a_kv_head_count_has_as_many_kv_heads_as_heads(tmp_path):
    """llama.cpp's default: its k_proj rows are un-interleaved per head as with head_count_kv = head_count."""
    import numpy as np

    from mixln_convert.io.loader import open_checkpoint

    generator = np.random.default_rng(0)
    shapes = {"token_embd": (32, 8), "output_norm": (8,), "blk.0.attn_norm": (8,), "blk.0.ffn_norm": (8,),
              "blk.0.attn_q": (8, 8), "blk.0.attn_k": (8, 8), "blk.0.attn_v": (8, 8), "blk.0.attn_output": (8, 8),
              "blk.0.ffn_gate": (16, 8), "blk.0.ffn_up": (16, 8), "blk.0.ffn_down": (8, 16)}
    state = {f"{name}.weight": generator.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    stated = open_checkpoint(_llama_gguf(tmp_path / "stated.gguf", state, kv_heads=2))
    unstated = open_checkpoint(_llama_gguf(tmp_path / "unstated.gguf", state, kv_heads=None))
    assert set(unstated.names()) == set(stated.names())
    assert all(torch.equal(unstated.get(name), stated.get(name)) for name in stated.names())
