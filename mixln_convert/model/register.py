"""Register the Mix-LN classes of every family with transformers' Auto* factories (importing this does it)."""

from transformers.models.auto.configuration_auto import AutoConfig
from transformers.models.auto.modeling_auto import AutoModel, AutoModelForCausalLM

from .modeling_mixln import FAMILIES

for config, model, causal_lm in FAMILIES:
    AutoConfig.register(config.model_type, config, exist_ok=True)
    AutoModel.register(config, model, exist_ok=True)
    AutoModelForCausalLM.register(config, causal_lm, exist_ok=True)
