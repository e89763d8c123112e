"""`minimind-trl` command: a thin dispatcher to the subcommands' own modules.

Each subcommand lives next to the code it drives and exposes `main(argv: list[str] | None) -> int`;
the dispatcher imports it lazily so `minimind-trl convert` does not pay for importing TRL.
"""

import importlib
import sys

# subcommand -> (module, one-line help)
SUBCOMMANDS = {
    "demo": ("minimind_trl.demo", "teach a tiny MiniMind the reasoning format with GRPO on CPU, in minutes"),
    "grpo": ("minimind_trl.grpo", "GRPO training from a recipe YAML (TRL's parser: YAML defaults, CLI overrides)"),
    "convert": ("minimind_trl.convert", "native MiniMind .pth -> Hugging Face folder (safetensors)"),
    "export": ("minimind_trl.export", "Hugging Face folder -> native .pth, Llama, Qwen3 or Qwen3-MoE"),
    "merge-lora": ("minimind_trl.merge_lora", "merge a LoRA adapter into its base model"),
}


def _usage() -> str:
    width = max(len(name) for name in SUBCOMMANDS)
    lines = ["usage: minimind-trl <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_text}" for name, (_, help_text) in SUBCOMMANDS.items()]
    lines += ["", "Run `minimind-trl <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in SUBCOMMANDS:
        print(f"minimind-trl: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[command][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
