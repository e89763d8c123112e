"""The commands that move MiniMind weights in and out of the Hugging Face format (the formats themselves are
`minimind_trl.formats`).

* `convert`: native `.pth` -> `save_pretrained` folder (`minimind-trl convert`);
* `export` / `export_gguf`: folder -> native `.pth`, Llama, Qwen3, Qwen3-MoE or one GGUF file for llama.cpp
  (`minimind-trl export`); `export_source` checks the folder it reads before the weights load; `serving_card`:
  the exported folder's model card;
* `merge_lora`: LoRA adapter + base -> full folder (`minimind-trl merge-lora`).
"""
