"""A checkpoint checked against its config before any work: config keys and types, the tensor
table the architecture needs (every layer, nothing beyond the last) and shapes, from file headers
alone (no weight reads); values are checked as tensors are read (:func:`check_finite`).
"""

import math

from ..errors import MixLNError
from ..limits import is_finite_number, is_number

FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
REQUIRED_SIZES = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
OPTIONAL_SIZES = ("num_key_value_heads", "head_dim", "max_position_embeddings")
# buffers some older checkpoints saved, which the model recomputes
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
ROPE_KEYS = ("rope_parameters", "rope_scaling")  # transformers 5's name, and the one before it
DEFAULT_ACTIVATION = "silu"  # LLaMA's


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_config(config, where: str) -> None:
    """Keys and types the converter and the model read, each error naming ``where`` and the key."""
    if not isinstance(config, dict):
        raise MixLNError(f"{where}: a config must be a JSON object, found a JSON {type(config).__name__}")
    declared = config.get("architectures")
    if declared is not None and not (isinstance(declared, list) and all(isinstance(a, str) for a in declared)):
        raise MixLNError(f"{where}: architectures must be a list of class names, got {declared!r}")
    if not isinstance(config.get("model_type", ""), str):
        raise MixLNError(f"{where}: model_type must be a string, got {config['model_type']!r}")
    for key in REQUIRED_SIZES:
        if key not in config:
            raise MixLNError(f"{where}: required key {key} is missing")
    for key in REQUIRED_SIZES + OPTIONAL_SIZES:
        value = config.get(key)
        if (key in REQUIRED_SIZES or value is not None) and not (_is_int(value) and value >= 1):
            raise MixLNError(f"{where}: {key} must be a positive integer, got {value!r}")
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    if config.get("head_dim") is None and hidden % heads:
        raise MixLNError(f"{where}: hidden_size {hidden} is not divisible by num_attention_heads {heads}")
    kv_heads = config.get("num_key_value_heads") or heads
    if heads % kv_heads:
        raise MixLNError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    for key in ("tie_word_embeddings", "attention_bias", "mlp_bias", "layernorm_scaling"):
        if config.get(key) is not None and not isinstance(config[key], bool):
            raise MixLNError(f"{where}: {key} must be true or false, got {config[key]!r}")
    eps = config.get("rms_norm_eps", 1e-6)
    if not (is_number(eps) and 0 < eps < 1):
        raise MixLNError(f"{where}: rms_norm_eps must be a number in (0, 1), got {eps!r}")
    for key in ("dtype", "torch_dtype"):
        if config.get(key) is not None and config[key] not in FLOAT_DTYPES:
            raise MixLNError(f"{where}: {key} must be one of {', '.join(FLOAT_DTYPES)}, got {config[key]!r}")
    check_rope(config, where)
    activation = config.get("hidden_act", DEFAULT_ACTIVATION)
    if activation != DEFAULT_ACTIVATION:  # transformers is imported only for a checkpoint that needs it
        from transformers.activations import ACT2FN

        if not isinstance(activation, str) or activation not in ACT2FN:
            raise MixLNError(f"{where}: hidden_act {activation!r} is not an activation transformers knows "
                             f"({', '.join(ACT2FN)})")
    k = config.get("post_ln_layers", 0)
    if not (_is_int(k) and 0 <= k <= config["num_hidden_layers"]):
        raise MixLNError(f"{where}: post_ln_layers must be an integer in [0, num_hidden_layers "
                         f"{config['num_hidden_layers']}], got {k!r}")
    if config.get("layernorm_scaling") and k:
        raise MixLNError(f"{where}: layernorm_scaling scales the norms of Pre-LN blocks; post_ln_layers must be "
                         f"0 with it, got {k}")


def check_rope(config: dict, where: str) -> None:
    """The rotary embedding as the installed transformers will build it: a rope type it knows, with the
    fields that type needs, giving finite frequencies. The default type, most checkpoints', needs
    nothing of transformers, so a streaming conversion does not import it."""
    for key in ROPE_KEYS:
        if config.get(key) is not None and not isinstance(config[key], dict):
            raise MixLNError(f"{where}: {key} must be an object, got {config[key]!r}")
    for key, theta in (("rope_theta", config.get("rope_theta")),
                       *((f"{key}.rope_theta", (config.get(key) or {}).get("rope_theta")) for key in ROPE_KEYS)):
        if theta is not None and not (is_finite_number(theta) and theta > 0):
            raise MixLNError(f"{where}: {key} must be a positive number, got {theta!r}")
    for key in ROPE_KEYS:
        rope = config.get(key) or {}
        field = "rope_type" if "rope_type" in rope else "type"  # "type": the name before transformers 4.45
        kind = rope.get(field, "default")
        if kind == "default":
            continue
        import torch
        from transformers import __version__
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        if not isinstance(kind, str) or kind not in ROPE_INIT_FUNCTIONS:
            raise MixLNError(f"{where}: {key}.{field} {kind!r} is not a rope type transformers {__version__} "
                             f"knows (default, {', '.join(ROPE_INIT_FUNCTIONS)})")
        built = check_config_loads(config, where)
        try:  # what the model's rotary embedding computes when it is built
            frequencies, scaling = ROPE_INIT_FUNCTIONS[kind](built, "cpu")
            ok = bool(torch.isfinite(frequencies).all() and (frequencies > 0).all()) and math.isfinite(scaling)
        except Exception as e:  # a field of the wrong type fails inside transformers in many ways
            ok, scaling = False, f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
        if not ok:
            raise MixLNError(f"{where}: {key} {rope}: transformers cannot compute the rotary frequencies of "
                             f"this {kind} rope ({scaling})")


def check_config_loads(config: dict, where: str):
    """Transformers' config of ``config``; what transformers refuses in it is a one-line error naming ``where``."""
    from transformers import AutoConfig

    from ..model import register  # noqa: F401  (the Mix-LN config class, for a converted checkpoint)

    try:
        return AutoConfig.for_model(**config)
    except Exception as e:  # transformers raises KeyError, ValueError and its own validation errors
        detail = " ".join(str(e).strip().split())[:300] or type(e).__name__
        raise MixLNError(f"{where}: transformers refuses this config: {detail}") from None


def expected_shapes(config: dict, arch, post_ln_layers: int) -> dict[str, tuple[int, ...]]:
    """Every tensor name a checkpoint of ``config`` must hold, with its shape; the first
    ``post_ln_layers`` blocks in the Post-LN layout (no input norm, a post-feedforward norm)."""
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    q, kv = heads * head_dim, kv_heads * head_dim
    shapes = {arch.embed: (vocab, hidden), arch.final_norm: (hidden,)}
    if not config.get("tie_word_embeddings", False):
        shapes[arch.lm_head] = (vocab, hidden)
    weights = dict(zip(arch.layer["attention_inputs"], [(q, hidden), (kv, hidden), (kv, hidden)]))
    weights[arch.layer["attention_output"]] = (hidden, q)
    weights.update({name: (inter, hidden) for name in arch.layer["mlp_inputs"]})
    weights[arch.layer["mlp_output"]] = (hidden, inter)
    # the roles of one family only (architectures/*.json): Qwen2's q/k/v biases, Qwen3's per-head q/k norms
    weights.update(zip(arch.layer.get("attention_input_biases", []), [(q,), (kv,), (kv,)]))
    weights.update({name: (head_dim,) for name in arch.layer.get("attention_head_norms", [])})
    biases = {}
    for part in ("attention", "mlp"):
        if config.get(f"{part}_bias"):
            roles = [*arch.layer[f"{part}_inputs"], arch.layer[f"{part}_output"]]
            biases.update({name: shape[:1] for name, shape in weights.items() if name in roles})
    for i in range(config["num_hidden_layers"]):
        prefix = arch.layer_prefix.format(i=i)
        norms = ["post_attention_norm", "post_feedforward_norm"] if i < post_ln_layers else ["input_norm",
                                                                                            "post_attention_norm"]
        shapes.update({prefix + arch.layer[role]: (hidden,) for role in norms})
        shapes.update({prefix + name: shape for name, shape in weights.items()})
        shapes.update({prefix + name.removesuffix(".weight") + ".bias": shape for name, shape in biases.items()})
    return shapes


def check_tensors(shapes: dict[str, tuple[int, ...]], config: dict, arch, where: str) -> None:
    """``shapes`` ({name: shape} of what the checkpoint holds) against what ``config`` needs."""
    num_layers = config["num_hidden_layers"]
    held = 1 + max((arch.layer_of(name) for name in shapes if arch.layer_of(name) is not None), default=-1)
    # enumerate at most one layer past those the checkpoint holds: an absurd num_hidden_layers
    # (1e9) is then refused at once, naming the first missing tensor, not after building 1e9 layers
    checked = min(num_layers, held + 1)
    expected = expected_shapes({**config, "num_hidden_layers": checked}, arch, config.get("post_ln_layers", 0))
    missing = [name for name in expected if name not in shapes]
    if missing:
        per_layer = len([n for n in expected if arch.layer_of(n) == checked - 1])
        count = len(missing) + (num_layers - checked) * per_layer
        more = f" (and {count - 1} more)" if count > 1 else ""
        raise MixLNError(f"{where}: tensor {missing[0]} is missing{more}; the config asks for {num_layers} layers")
    for name, shape in shapes.items():
        if name in expected:
            if tuple(shape) != expected[name]:
                raise MixLNError(f"{where}: tensor {name} has shape {list(shape)}, the config asks for "
                                 f"{list(expected[name])}")
            continue
        layer = arch.layer_of(name)
        if layer is not None and layer >= num_layers:
            raise MixLNError(f"{where}: tensor {name} lies beyond the config's num_hidden_layers {num_layers}")
        if name.endswith(IGNORED_SUFFIXES) or (name == arch.lm_head and tuple(shape) == expected[arch.embed]):
            continue  # a buffer the model recomputes, or a tied head saved anyway (the embeddings are used)
        raise MixLNError(f"{where}: unexpected tensor {name} (shape {list(shape)}) for this "
                         f"{'Mix-LN' if config.get('post_ln_layers') else arch.name} layout")


def check_finite(name: str, tensor, where: str) -> None:
    """Refuse a floating tensor holding NaN or inf (aminmax: memory speed, without isfinite()'s scratch mask)."""
    import torch

    if not tensor.is_floating_point() or tensor.numel() == 0:
        return
    low, high = torch.aminmax(tensor.reshape(-1))
    if not (torch.isfinite(low) and torch.isfinite(high)):
        raise MixLNError(f"{where}: tensor {name} holds NaN or inf values")
