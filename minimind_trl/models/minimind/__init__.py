"""MiniMind as a transformers model: both upstream generations (MiniMind2, MiniMind-3), dense and MoE.

`configuration_minimind` and `modeling_minimind` are self-contained (they import nothing from this package but
each other), because `save_pretrained` copies them next to the weights for `trust_remote_code=True` users.
`tokenization_minimind` builds MiniMind-style tokenizers offline.
"""

from .configuration_minimind import MINIMIND2, MINIMIND3, MiniMindConfig
from .modeling_minimind import MiniMindForCausalLM, MiniMindModel, MiniMindPreTrainedModel

__all__ = ["MINIMIND2", "MINIMIND3", "MiniMindConfig", "MiniMindForCausalLM", "MiniMindModel", "MiniMindPreTrainedModel"]
