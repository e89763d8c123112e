"""Moving MiniMind weights in and out of the Hugging Face format.

* `native_config`: what a native `.pth`'s tensors say about its architecture, and the settings they cannot show;
* `convert`: native `.pth` -> `save_pretrained` folder (`minimind-trl convert`);
* `export_native` / `export` / `export_gguf`: folder -> native `.pth`, Llama, Qwen3, Qwen3-MoE or one GGUF file
  for llama.cpp (`minimind-trl export`); `export_source` checks the folder it reads before the weights load;
* `merge_lora`: LoRA adapter + base -> full folder (`minimind-trl merge-lora`).
"""
