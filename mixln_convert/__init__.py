"""mixln-convert: convert pretrained Pre-LN LLaMA checkpoints to Mix-LN (arXiv 2412.13795).

Python API (the CLI is a thin layer over it): every command but ``fetch`` and ``recipes`` is a function
of its name here, ``eval`` as ``score_checkpoint`` and ``demo`` as ``run_demo``::

    from mixln_convert import convert, heal, train, load_recipe, analyze, prune, compare, export
    convert("smollm2/", "smollm2-mixln/", alpha=0.25, strategy="calibrated")

Importing this package registers the Mix-LN model type with transformers' ``AutoConfig`` and
``AutoModelForCausalLM`` as soon as transformers' auto classes are in use, so converted
checkpoints load with plain ``from_pretrained`` (no remote code).
"""

__version__ = "0.1.0"

from .model.autoregister import install as _install_autoregister

_install_autoregister()

_API = {
    "convert": "mixln_convert.conversion.converter",
    "score_checkpoint": "mixln_convert.evaluation.perplexity",
    "sweep": "mixln_convert.workflows.sweep",
    "study": "mixln_convert.workflows.study",
    "tokenize": "mixln_convert.data.tokenization",
    "estimate": ("mixln_convert.training.memory", "estimate_recipe"),
    "inspect": ("mixln_convert.inspect_checkpoint", "describe"),
    "export": "mixln_convert.export",  # once imported, the subpackage itself, which calls export()
    "heal": "mixln_convert.healing",
    "train": "mixln_convert.workflows.train",
    "run_demo": "mixln_convert.workflows.demo",
    "load_recipe": "mixln_convert.training",
    "analyze": "mixln_convert.analysis.analyze",
    "prune": "mixln_convert.surgery.prune",
    "compare": "mixln_convert.report",
    "evaluate_perplexity": "mixln_convert.evaluation.perplexity",
    "load_model": "mixln_convert.surgery.loading",
    "load_tokenizer": "mixln_convert.surgery.loading",
    "MixLNConfig": "mixln_convert.model.configuration_mixln",
    "MixLNForCausalLM": "mixln_convert.model.modeling_mixln",
    "MixLNModel": "mixln_convert.model.modeling_mixln",
}
__all__ = [*_API, "__version__"]


def __getattr__(name):
    # The API is imported on first use: torch and transformers take seconds to import.
    if name in _API:
        import importlib

        module, attribute = _API[name] if isinstance(_API[name], tuple) else (_API[name], name)
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'mixln_convert' has no attribute {name!r}")
