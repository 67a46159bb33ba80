"""LayerNorm Scaling (arXiv 2502.05795): the model's scaling against a hand-written forward, the exact
retrofit of a pretrained model, from scratch, pruning, bad inputs, the study's verdicts and the
sweep's sentence (the study's LNS arm trains in test_study.py, three arms in test_train.py)."""

import hashlib
import json
import math
import re
import shutil
from types import SimpleNamespace

import pytest
import torch
from huggingface_hub.errors import StrictDataclassClassValidationError
from safetensors.torch import load_file
from tiny import TINY_CONFIG, make_tiny_llama

from mixln_convert.errors import MixLNError
from mixln_convert.model.configuration_mixln import MixLNConfig
from mixln_convert.model.modeling_mixln import MixLNForCausalLM
from mixln_convert.surgery.loading import load_model

L = TINY_CONFIG["num_hidden_layers"]
IDS = torch.randint(3, TINY_CONFIG["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(0))
BLOCK_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight")


def rms_norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    return norm.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)


def reference_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """The LNS paper's Pre-LN block with each norm output of block l (from 1) times 1/sqrt(l), written
    out by hand; only the attention and MLP modules are the model's."""
    inner = model.model
    x = inner.embed_tokens.weight[ids]
    rotary = inner.rotary_emb(x, torch.arange(ids.shape[1])[None])
    causal = torch.full((ids.shape[1], ids.shape[1]), float("-inf")).triu(1)[None, None]
    for l, layer in enumerate(inner.layers, start=1):
        attention = layer.self_attn(hidden_states=rms_norm(x, layer.input_layernorm) / math.sqrt(l),
                                    attention_mask=causal, position_embeddings=rotary)[0]
        h = x + attention
        x = h + layer.mlp(rms_norm(h, layer.post_attention_layernorm) / math.sqrt(l))
    return rms_norm(x, inner.norm) @ model.lm_head.weight.T


def tensors(folder) -> dict[str, torch.Tensor]:
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


def hashes(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@torch.no_grad()
def test_the_model_scales_each_norm_output_by_one_over_sqrt_l():
    torch.manual_seed(0)
    model = MixLNForCausalLM(MixLNConfig(**TINY_CONFIG, layernorm_scaling=True)).eval()
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1 + 0.5 * torch.rand_like(p))
    torch.testing.assert_close(model(input_ids=IDS).logits, reference_logits(model, IDS), rtol=1e-5, atol=1e-5)
    unscaled = MixLNForCausalLM(MixLNConfig(**TINY_CONFIG)).eval()
    unscaled.load_state_dict(model.state_dict())
    assert (unscaled(input_ids=IDS).logits - model(input_ids=IDS).logits).abs().max() > 1e-2


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])  # Mistral's blocks are LLaMA's
@torch.no_grad()
def test_the_retrofit_computes_the_sources_function_with_the_scaling_in_the_model(family, tiny_convert, tmp_path):
    tiny_llama = make_tiny_llama(tmp_path / "src", family=family)
    before = hashes(tiny_llama)
    out = tiny_convert(tiny_llama, layout="lns")
    assert hashes(tiny_llama) == before  # the input is never written
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"].startswith("mixln_") and config["layernorm_scaling"] is True
    assert config["post_ln_layers"] == 0 and config["mixln_provenance"]["strategy"] == "exact"
    source, lns = load_model(tiny_llama), load_model(out)
    assert type(lns).__name__.startswith("MixLN")
    assert [layer.norm_scale for layer in lns.model.layers] == [1 / math.sqrt(i + 1) for i in range(L)]
    reference = source(input_ids=IDS).logits
    torch.testing.assert_close(lns(input_ids=IDS).logits, reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(reference_logits(lns, IDS), reference, rtol=1e-5, atol=1e-5)
    # the gains carry sqrt(l), every other tensor is the source's
    original, converted = tensors(tiny_llama), tensors(out)
    assert original.keys() == converted.keys()
    for name, tensor in converted.items():
        if name.endswith(BLOCK_NORMS):
            l = int(name.split(".")[2]) + 1
            torch.testing.assert_close(tensor, original[name] * math.sqrt(l), rtol=1e-6, atol=0, msg=name)
        else:
            assert torch.equal(tensor, original[name]), name
    # not folded away: the same weights read as a plain LLaMA compute something else
    plain = type(source)(source.config).eval()
    plain.load_state_dict(lns.state_dict())
    assert (plain(input_ids=IDS).logits - reference).abs().max() > 1e-2


def test_from_scratch_it_is_the_pre_ln_plan_with_the_scaling_on(tiny_llama, tiny_convert):
    pre = tiny_convert(tiny_llama, "pre", alpha=0.0, strategy="scratch", seed=3)
    lns = tiny_convert(tiny_llama, "lns", layout="lns", strategy="scratch", seed=3)
    a, b = tensors(pre), tensors(lns)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)  # gains 1, as in the LNS paper
    assert all(torch.equal(b[n], torch.ones_like(b[n])) for n in b if n.endswith(BLOCK_NORMS))
    assert json.loads((lns / "config.json").read_text())["layernorm_scaling"] is True
    with torch.no_grad():
        assert not torch.allclose(load_model(pre)(input_ids=IDS).logits, load_model(lns)(input_ids=IDS).logits)


@torch.no_grad()
def test_pruning_keeps_what_each_kept_block_computes(converted_lns, tmp_path):
    from mixln_convert.analysis.layers import BlockRunner
    from mixln_convert.surgery.prune import prune

    pruned = prune(converted_lns, tmp_path / "pruned", layers="2,4", progress=False)
    config = json.loads((pruned / "config.json").read_text())
    assert config["num_hidden_layers"] == L - 2 and config["layernorm_scaling"] is True
    skipped = BlockRunner(load_model(converted_lns)).forward(IDS, skip={2, 4})
    torch.testing.assert_close(load_model(pruned)(input_ids=IDS).logits, skipped, rtol=1e-5, atol=1e-5)


def test_the_config_refuses_scaling_with_post_ln_blocks():
    with pytest.raises(StrictDataclassClassValidationError, match="layernorm_scaling"):
        MixLNConfig(**TINY_CONFIG, post_ln_layers=2, layernorm_scaling=True)


@pytest.mark.parametrize("edit, fragment", [
    ({"layernorm_scaling": "yes"}, "layernorm_scaling must be true or false"),
    ({"post_ln_layers": 2}, "layernorm_scaling scales the norms of Pre-LN blocks"),
])
def test_a_checkpoint_with_a_bad_scaling_is_refused_in_one_line(edit, fragment, converted_lns, tmp_path, cli):
    folder = shutil.copytree(converted_lns, tmp_path / "edited")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **edit}))
    result = cli("inspect", folder)
    assert result.exit_code == 1 and fragment in result.stderr and str(folder) in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_inspect_names_the_scaled_blocks(converted_lns, cli):
    result = cli("inspect", converted_lns)
    assert result.exit_code == 0 and "LayerNorm Scaling" in result.stdout
    assert sum(line.split()[1:2] == ["LNS"] for line in result.stdout.splitlines()) == L


@pytest.mark.parametrize("arms, fragment", [
    ("[mixln, lns]", None), ("[lns]", None), ("[postln]", "arms: unknown arm 'postln' (choose from mixln, preln, lns)"),
    ("[lns, lns]", "arms: 'lns' is given twice"), ("[]", "arms: give 1 to 256 names, got 0"), ("lns", None),
])
def test_the_recipe_lists_the_arms(arms, fragment, tiny_llama):
    from mixln_convert.training import load_recipe

    overrides = [f"source={tiny_llama}", f"arms={arms}"]
    if fragment is None:
        assert load_recipe("smollm2-135m-cpu", overrides).arms == tuple(arms.strip("[]").replace(" ", "").split(","))
    else:
        with pytest.raises(MixLNError, match=re.escape(fragment)):
            load_recipe("smollm2-135m-cpu", overrides)
    assert load_recipe("smollm2-135m-cpu", [f"source={tiny_llama}"]).arms == ("mixln", "preln")


# ---- study and sweep ---------------------------------------------------------------------------


def test_lns_is_judged_against_pre_ln_on_its_papers_claims():
    from mixln_convert.report.study import LNS_CLAIMS
    from mixln_convert.workflows.study import lns_verdicts, verdicts

    figures = {"Pre-LN": (20.0, 20.2, 0.10), "Mix-LN (alpha 0.25)": (21.0, 21.1, 0.12), "LNS": (18.0, 18.3, 0.10)}
    runs = [{"scheme": scheme, "seed": seed, "arm": arm, "final_val_ppl": ppls[seed] + (scheme == "plain"),
             "deep_layer_drop": drop, "grad_norm_cv": 0.5}
            for scheme in ("scaled", "plain") for arm, (*ppls, drop) in figures.items() for seed in (0, 1)]
    result = SimpleNamespace(arms=list(figures), schemes=["scaled", "plain"], runs=[SimpleNamespace(**r) for r in runs])
    found = lns_verdicts(result)
    assert set(found["scaled"]) == set(LNS_CLAIMS)
    assert found["scaled"]["perplexity"].outcome == "reproduced"  # 18.15 vs 20.1, spread 0.3
    assert found["scaled"]["perplexity"].tested == pytest.approx(18.15)
    assert found["scaled"]["deep blocks matter more"].outcome == "too close to call"  # equal drops
    assert verdicts(result)["scaled init helps LNS"].outcome == "reproduced"  # 1 lower on every seed
    assert verdicts(result)["scaled"]["perplexity"].outcome == "not reproduced"  # Mix-LN's, as before


def test_sweep_lns_needs_training(tiny_llama, tmp_path, cli):
    result = cli("sweep", tiny_llama, "--out", tmp_path / "sweep", "--lns")
    assert result.exit_code == 1 and "--lns" in result.stderr and "--train-tokens" in result.stderr
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("lns, control, outcome", [
    ([18.0, 18.2], [20.0, 20.3], "LNS is lower"),
    ([21.0, 21.2], [20.0, 20.3], "LNS is higher"),
    ([19.0, 20.5], [20.0, 20.3], "too close to call"),
    ([10.0], [20.0], "too close to call"),  # one seed: no spread between seeds to judge by
])
def test_the_sweep_calls_lns_against_the_control_only_beyond_the_seeds_spread(lns, control, outcome):
    from mixln_convert.report.sweep import _lns_sentence

    sentence = _lns_sentence(SimpleNamespace(lns=[SimpleNamespace(final_val_ppl=p) for p in lns],
                                             control=[SimpleNamespace(final_val_ppl=p) for p in control]))
    assert f"; {outcome} (gap" in sentence and f"{sum(lns) / len(lns):.2f} vs Pre-LN control" in sentence
