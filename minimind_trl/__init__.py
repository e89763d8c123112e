"""minimind-trl: MiniMind's GRPO training on Hugging Face TRL.

Importing the package registers MiniMind with transformers' Auto classes, so
`AutoModelForCausalLM.from_pretrained(folder)` works without `trust_remote_code`, and so do
`AutoModelForSequenceClassification` (TRL's RewardTrainer, value models) and the other generic heads. It also
gives PEFT MiniMind's default LoRA targets, so `LoraConfig()` without `target_modules` works on MiniMind.
"""

import warnings

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from .models.minimind import (
    MINIMIND2,
    MINIMIND3,
    MiniMindConfig,
    MiniMindForCausalLM,
    MiniMindModel,
    MiniMindPreTrainedModel,
)
from .models.minimind.peft_defaults import register_peft_defaults
from .models.minimind.modeling_minimind import (
    MiniMindForQuestionAnswering,
    MiniMindForSequenceClassification,
    MiniMindForTokenClassification,
)

__version__ = "0.1.0"

# TRL warns that the installed vLLM is outside the range it tested each time `is_vllm_available()` runs, with the
# caller as the location: about 20 call sites, five warnings in a run. Shown once per process.
TRL_VLLM_VERSION_WARNING = "TRL currently supports vLLM versions"
warnings.filterwarnings("once", message=TRL_VLLM_VERSION_WARNING, category=UserWarning)

_AUTO_CLASSES = {
    "AutoModel": (AutoModel, MiniMindModel),
    "AutoModelForCausalLM": (AutoModelForCausalLM, MiniMindForCausalLM),
    "AutoModelForSequenceClassification": (AutoModelForSequenceClassification, MiniMindForSequenceClassification),
    "AutoModelForTokenClassification": (AutoModelForTokenClassification, MiniMindForTokenClassification),
    "AutoModelForQuestionAnswering": (AutoModelForQuestionAnswering, MiniMindForQuestionAnswering),
}

AutoConfig.register("minimind", MiniMindConfig, exist_ok=True)
register_peft_defaults()
for _auto_class, _model_class in _AUTO_CLASSES.values():
    _auto_class.register(MiniMindConfig, _model_class, exist_ok=True)

# save_pretrained writes `auto_map` and copies the two self-contained modules next to the weights,
# so people without this package can load a saved folder with trust_remote_code=True.
MiniMindConfig.register_for_auto_class()
for _name, (_, _model_class) in _AUTO_CLASSES.items():
    _model_class.register_for_auto_class(_name)

__all__ = [
    "MINIMIND2",
    "MINIMIND3",
    "MiniMindConfig",
    "MiniMindForCausalLM",
    "MiniMindForQuestionAnswering",
    "MiniMindForSequenceClassification",
    "MiniMindForTokenClassification",
    "MiniMindModel",
    "MiniMindPreTrainedModel",
]
