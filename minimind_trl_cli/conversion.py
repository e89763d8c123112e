"""The flags of `minimind-trl convert`, `export` and `merge-lora`: argparse alone, so their `--help` and usage errors
need no torch. The commands themselves (`minimind_trl.conversion`) parse with these same parsers."""

from .flags import DTYPE_CHOICES, FlagParser

EXPORT_FORMATS = ("native", "llama", "qwen3", "qwen3_moe", "gguf")


def convert_parser() -> FlagParser:
    parser = FlagParser(
        prog="minimind-trl convert",
        description="Convert a native MiniMind checkpoint (upstream .pth state dict, fp16 or fp32) into a Hugging "
        "Face folder that AutoModelForCausalLM loads. The architecture is read from the tensors; MiniMind2's query "
        "head count is not stored in them (upstream default 8).",
    )
    parser.add_argument("checkpoint", help="native state dict: .pth (upstream trainers), .bin or .safetensors")
    parser.add_argument("output_dir", help="folder to write (created; must not exist or be empty unless --force)")
    parser.add_argument(
        "--num_attention_heads", type=int, default=None, metavar="N",
        help="query heads the model was trained with; MiniMind2 cannot be checked beyond the tensor shapes "
        "(default: 8, upstream's); MiniMind-3 reads it from the shapes",
    )  # fmt: skip
    parser.add_argument(
        "--tokenizer", default=None, metavar="DIR",
        help="tokenizer folder to save alongside, e.g. upstream's model/ (default: none)",
    )  # fmt: skip
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="an upstream MiniMindConfig keyword of either architecture, e.g. inference_rope_scaling=true, "
        "rope_theta=1e4, num_experts_per_tok=2, aux_loss_alpha=0.02 (values are JSON/Python literals; repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--config", default=None, metavar="JSON",
        help="a JSON file of the same keywords (default: the sidecar CHECKPOINT_STEM.config.json that "
        "`minimind-trl export --format native` writes, if present); --set wins",
    )  # fmt: skip
    parser.add_argument(
        "--dtype", default="float32", choices=[*DTYPE_CHOICES, "auto"],
        help="weights dtype of the folder (default: %(default)s, fp16 -> fp32 is lossless; auto keeps the "
        "checkpoint's)",
    )  # fmt: skip
    parser.add_argument(
        "--force", action="store_true",
        help="replace an earlier output in OUTPUT_DIR (a folder of model files; never the input or other files)",
    )  # fmt: skip
    return parser


def export_parser() -> FlagParser:
    parser = FlagParser(
        prog="minimind-trl export",
        description="Export a MiniMind Hugging Face folder: native (upstream .pth), llama (MiniMind2 dense), "
        "qwen3 (MiniMind-3 dense) or qwen3_moe (MiniMind-3 MoE) folders for transformers, vLLM and SGLang, or one "
        "gguf file (llama / qwen3 / qwen3moe, with the tokenizer) for llama.cpp and Ollama.",
    )
    parser.add_argument("model_dir", help="MiniMind folder (from `minimind-trl convert`, training or save_pretrained)")
    parser.add_argument("output", help="native: the .pth file to write; gguf: the .gguf file; others: the folder")
    parser.add_argument(
        "--format", required=True, choices=EXPORT_FORMATS, dest="fmt",
        help="what to write (required): native (upstream's .pth and a settings sidecar), llama, qwen3 or qwen3_moe "
        "(the architecture matching the model's), or gguf",
    )  # fmt: skip
    parser.add_argument(
        "--dtype", default="auto", choices=[*DTYPE_CHOICES, "auto", "q8_0"],
        help="weights dtype (default: auto, the folder's; upstream's trainers save float16); gguf also takes q8_0 "
        "(norms and the MoE router stay float32 there, as llama.cpp's converter keeps them)",
    )  # fmt: skip
    parser.add_argument(
        "--tokenizer", default=None, metavar="DIR",
        help="tokenizer folder to include (default: MODEL_DIR's own); gguf needs one, the folders warn without",
    )  # fmt: skip
    parser.add_argument(
        "--force", action="store_true",
        help="replace an earlier export at OUTPUT (never the input, a folder holding it, or other files)",
    )  # fmt: skip
    parser.add_argument(
        "--no_verify", dest="verify", action="store_false",
        help="skip loading the export with transformers' class and comparing logits before it is moved into place",
    )  # fmt: skip
    return parser


def merge_lora_parser() -> FlagParser:
    parser = FlagParser(
        prog="minimind-trl merge-lora",
        description="Merge a LoRA adapter (the output of a --use_peft run) into its base model: a full MiniMind "
        "folder that loads with from_pretrained, exports and pushes like any other.",
    )
    parser.add_argument("adapter_dir", help="folder with adapter_config.json (the output_dir of a --use_peft run)")
    parser.add_argument("output_dir", help="where to write the merged model (must not exist unless --force)")
    parser.add_argument(
        "--base_model", default=None, metavar="PATH_OR_HUB_ID",
        help="base model folder or Hub id (default: the adapter's base_model_name_or_path)",
    )  # fmt: skip
    parser.add_argument(
        "--dtype", default="float32", choices=DTYPE_CHOICES,
        help="dtype to merge and save in (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--force", action="store_true",
        help="replace an earlier merge in output_dir (never the adapter, the base model or other files)",
    )  # fmt: skip
    return parser


__all__ = ["EXPORT_FORMATS", "convert_parser", "export_parser", "merge_lora_parser"]
