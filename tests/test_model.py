"""The Mix-LN model itself: block arithmetic, KV cache, gradient checkpointing, dtypes, config."""

import subprocess
import sys

import pytest
import torch
from huggingface_hub.errors import StrictDataclassClassValidationError
from tiny import TINY_CONFIG
from transformers import AutoConfig, AutoModelForCausalLM

from mixln_convert.model.configuration_mixln import MixLNConfig
from mixln_convert.model.modeling_mixln import MixLNForCausalLM, enable_checkpointing

L = TINY_CONFIG["num_hidden_layers"]


def tiny_mixln(post_ln_layers: int, seed: int = 0, **overrides) -> MixLNForCausalLM:
    """A random Mix-LN model whose norm gains are not ones (so a misplaced norm shows)."""
    torch.manual_seed(seed)
    model = MixLNForCausalLM(MixLNConfig(**{**TINY_CONFIG, **overrides}, post_ln_layers=post_ln_layers))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.5 * torch.rand_like(p))
    return model.eval()


def token_ids(batch: int = 2, length: int = 24, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, TINY_CONFIG["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed))


def rms_norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    return norm.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)


def reference_logits(model: MixLNForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    """docs/mixln.md's block formulas written out by hand; only attention and MLP modules are reused."""
    inner, n_post = model.model, model.config.post_ln_layers
    x = inner.embed_tokens.weight[ids]
    positions = torch.arange(ids.shape[1])[None]
    rotary = inner.rotary_emb(x, positions)
    causal = torch.full((ids.shape[1], ids.shape[1]), float("-inf")).triu(1)[None, None]

    def attention(layer, h):
        return layer.self_attn(hidden_states=h, attention_mask=causal, position_embeddings=rotary)[0]

    for i, layer in enumerate(inner.layers):
        if i < n_post:  # Post-LN: h = N_pa(x + A(x)); out = N_pf(h + M(h))
            h = rms_norm(x + attention(layer, x), layer.post_attention_layernorm)
            x = rms_norm(h + layer.mlp(h), layer.post_feedforward_layernorm)
        else:  # Pre-LN: h = x + A(N_in(x)); out = h + M(N_pa(h))
            h = x + attention(layer, rms_norm(x, layer.input_layernorm))
            x = h + layer.mlp(rms_norm(h, layer.post_attention_layernorm))
    return rms_norm(x, inner.norm) @ model.lm_head.weight.T


@pytest.mark.parametrize("n_post", [0, 2, L])
@torch.no_grad()
def test_forward_matches_hand_written_blocks(n_post):
    model = tiny_mixln(n_post)
    assert [layer.is_post_ln for layer in model.model.layers] == [i < n_post for i in range(L)]
    assert all(hasattr(layer, "input_layernorm") != layer.is_post_ln for layer in model.model.layers)
    assert all(hasattr(layer, "post_feedforward_layernorm") == layer.is_post_ln for layer in model.model.layers)
    ids = token_ids()
    torch.testing.assert_close(model(input_ids=ids).logits, reference_logits(model, ids), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_generate_with_cache_equals_without():
    model = tiny_mixln(3)
    prompt = token_ids(batch=1, length=6)
    kwargs = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    cached = model.generate(prompt, use_cache=True, **kwargs)
    uncached = model.generate(prompt, use_cache=False, **kwargs)
    assert cached.shape == (1, 18)
    assert torch.equal(cached, uncached)


def test_gradient_checkpointing_gives_same_gradients():
    model = tiny_mixln(2).train()
    ids = token_ids()
    mlp_calls = []
    model.model.layers[0].mlp.register_forward_hook(lambda *_: mlp_calls.append(1))

    def gradients():
        model.zero_grad()
        mlp_calls.clear()
        model(input_ids=ids, labels=ids).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    plain = gradients()
    assert len(mlp_calls) == 1
    enable_checkpointing(model)  # whichever name the installed transformers has
    checkpointed = gradients()
    assert len(mlp_calls) == 2  # the Post-LN block was recomputed in the backward pass
    assert plain.keys() == checkpointed.keys()
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@torch.no_grad()
def test_forward_in_dtype_is_finite(dtype):
    model = tiny_mixln(2).to(dtype)
    logits = model(input_ids=token_ids()).logits
    assert logits.dtype == dtype
    assert torch.isfinite(logits).all()


@torch.no_grad()
def test_tied_embeddings_survive_save_and_load(tmp_path):
    import mixln_convert  # noqa: F401  (registers mixln_llama with the Auto* classes)

    model = tiny_mixln(2, tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is MixLNForCausalLM and loaded.config.post_ln_layers == 2
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    ids = token_ids()
    assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


@pytest.mark.parametrize("n_post", [-1, L + 1])
def test_config_rejects_post_ln_layers_out_of_range(n_post):
    with pytest.raises(StrictDataclassClassValidationError, match="post_ln_layers"):
        MixLNConfig(**TINY_CONFIG, post_ln_layers=n_post)


def test_config_model_type_and_round_trip():
    import mixln_convert  # noqa: F401

    config = MixLNConfig(**TINY_CONFIG, post_ln_layers=3, alpha=0.375)
    assert config.model_type == "mixln_llama"
    again = AutoConfig.for_model(**config.to_dict())
    assert type(again) is MixLNConfig
    assert (again.post_ln_layers, again.alpha) == (3, 0.375)


def test_causal_lm_lists_generation_mixin_among_its_own_bases():
    from transformers import GenerationMixin

    assert GenerationMixin in MixLNForCausalLM.__bases__


def test_legacy_gradient_checkpointing_flag_reaches_the_mix_ln_layers():
    model = MixLNForCausalLM(MixLNConfig(**TINY_CONFIG, post_ln_layers=2, gradient_checkpointing=True))
    assert all(layer.gradient_checkpointing for layer in model.model.layers)
    plain = MixLNForCausalLM(MixLNConfig(**TINY_CONFIG, post_ln_layers=2))
    assert not any(layer.gradient_checkpointing for layer in plain.model.layers)


IMPORT_ORDERS = (
    "from mixln_convert import MixLNForCausalLM",  # the Mix-LN modeling module before transformers' auto classes
    "import mixln_convert; from transformers import LlamaForCausalLM",  # LLaMA's model file runs the auto module
    "import mixln_convert; from transformers import MistralForCausalLM",  # so does every model file's import
    "import mixln_convert; from transformers import Qwen2ForCausalLM",  # a file the Mix-LN modeling module imports
    "import mixln_convert; from transformers import Qwen3ForCausalLM",
    "import mixln_convert; import transformers.modeling_layers",
    "import mixln_convert; from transformers import AutoModelForCausalLM",
)


def test_registration_survives_any_import_order():
    """In a fresh interpreter, whatever is imported first, the Mix-LN classes end up registered
    with the Auto classes, and no import is left half-done (a circular import would raise). The
    interpreters run side by side: each spends its seconds importing torch and transformers."""
    check = ("\nfrom transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING\n"
             "from mixln_convert.model.configuration_mixln import MixLNConfig\n"
             "print(MODEL_FOR_CAUSAL_LM_MAPPING[MixLNConfig].__name__)")
    running = {first: subprocess.Popen([sys.executable, "-c", first + check], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True) for first in IMPORT_ORDERS}
    finished = {first: proc.communicate(timeout=600) + (proc.returncode,) for first, proc in running.items()}
    failed = {first: err[-800:] for first, (out, err, code) in finished.items()
              if code != 0 or out.strip() != "MixLNForCausalLM"}
    assert not failed, failed


def test_a_converted_folder_loads_without_asking_for_remote_code(converted):
    """After ``import mixln_convert``, nothing asks whether to run the folder's own modeling code
    (transformers would prompt on a terminal, and time out after 15 s): the tokenizer first, as
    transformers reads the config's auto_map for it, then the config and the model."""
    code = ("import mixln_convert\nfrom transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer\n"
            f"path = {str(converted)!r}\nAutoTokenizer.from_pretrained(path)\n"
            "print(type(AutoConfig.from_pretrained(path)).__name__, type(AutoModelForCausalLM.from_pretrained(path)).__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-800:]
    assert "custom code" not in done.stdout + done.stderr and "trust_remote_code" not in done.stderr, done.stderr[-800:]
    assert done.stdout.split()[-2:] == ["MixLNConfig", "MixLNForCausalLM"]
