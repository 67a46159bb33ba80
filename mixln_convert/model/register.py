"""Register the Mix-LN classes with transformers' Auto* factories (importing this does it)."""

from transformers.models.auto.configuration_auto import AutoConfig
from transformers.models.auto.modeling_auto import AutoModel, AutoModelForCausalLM

from .configuration_mixln import MixLNConfig
from .modeling_mixln import MixLNForCausalLM, MixLNModel

AutoConfig.register(MixLNConfig.model_type, MixLNConfig, exist_ok=True)
AutoModel.register(MixLNConfig, MixLNModel, exist_ok=True)
AutoModelForCausalLM.register(MixLNConfig, MixLNForCausalLM, exist_ok=True)
