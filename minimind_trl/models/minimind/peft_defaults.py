"""MiniMind's default LoRA targets, registered with PEFT so a bare `LoraConfig()` adapts a MiniMind model as it
adapts a Llama (PEFT keeps one default target list per `model_type` and has none for `minimind`)."""

# MiniMind's linear layers (attention and MLP, dense and MoE experts); the LM head is tied to the embeddings.
MINIMIND_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def register_peft_defaults() -> None:
    """Add `minimind` to PEFT's default LoRA targets, unless the user (or a later PEFT) already set them."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.setdefault("minimind", list(MINIMIND_LORA_TARGETS))


__all__ = ["MINIMIND_LORA_TARGETS", "register_peft_defaults"]
