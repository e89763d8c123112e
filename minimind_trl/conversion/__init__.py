"""Moving MiniMind weights in and out of the Hugging Face format.

* `native_config`: what a native `.pth`'s tensors say about its architecture, and the settings they cannot show;
* `convert`: native `.pth` -> `save_pretrained` folder (`minimind-trl convert`);
* `export_native` / `export`: folder -> native `.pth`, Llama, Qwen3 or Qwen3-MoE (`minimind-trl export`);
* `merge_lora`: LoRA adapter + base -> full folder (`minimind-trl merge-lora`).
"""
