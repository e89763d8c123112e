"""The forms a MiniMind's weights and config take outside transformers, below the trainer that writes and checks
them: upstream's native `.pth` and its config (`native_config`, `export_native`), the native architectures an
export and vLLM run it as (`architectures`, `vllm_config`)."""
