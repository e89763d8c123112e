"""minimind-trl: MiniMind's GRPO training on Hugging Face TRL.

Importing the package registers MiniMind with transformers' Auto classes, so
`AutoModelForCausalLM.from_pretrained(folder)` works without `trust_remote_code`.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .models.minimind import (
    MINIMIND2,
    MINIMIND3,
    MiniMindConfig,
    MiniMindForCausalLM,
    MiniMindModel,
    MiniMindPreTrainedModel,
)

__version__ = "0.1.0"

AutoConfig.register("minimind", MiniMindConfig, exist_ok=True)
AutoModel.register(MiniMindConfig, MiniMindModel, exist_ok=True)
AutoModelForCausalLM.register(MiniMindConfig, MiniMindForCausalLM, exist_ok=True)

# save_pretrained writes `auto_map` and copies the two self-contained modules next to the weights,
# so people without this package can load a saved folder with trust_remote_code=True.
MiniMindConfig.register_for_auto_class()
MiniMindModel.register_for_auto_class("AutoModel")
MiniMindForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ = [
    "MINIMIND2",
    "MINIMIND3",
    "MiniMindConfig",
    "MiniMindForCausalLM",
    "MiniMindModel",
    "MiniMindPreTrainedModel",
]
