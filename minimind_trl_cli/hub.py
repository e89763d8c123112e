"""The flags of `minimind-trl push`: argparse alone, so its `--help` needs no torch. The command itself
(`minimind_trl.cli.push`) parses with this parser."""

from .flags import FlagParser

PUSH_COMMIT_MESSAGE = "Upload with minimind-trl push"


def push_parser() -> FlagParser:
    parser = FlagParser(
        prog="minimind-trl push",
        description="Push a run's finished output folder to the Hugging Face Hub later: what the run's own final push "
        "sends (the model or LoRA adapter, tokenizer, modeling code, model card, the native .pth), without the "
        "checkpoint-N folders and the run's _-prefixed entries.",
    )
    parser.add_argument("output_dir", help="the output_dir of a finished run (or a merge-lora / convert output)")
    parser.add_argument("--hub_model_id", required=True, metavar="NAMESPACE/NAME",
                        help="the Hub repository to push to (required)")
    parser.add_argument("--hub_private_repo", action="store_true", help="create the repository private")
    parser.add_argument("--hub_revision", default=None, metavar="BRANCH", help="the branch to push to (default: main)")
    parser.add_argument("--commit_message", default=PUSH_COMMIT_MESSAGE,
                        help="the commit's message (default: %(default)s)")
    return parser


__all__ = ["PUSH_COMMIT_MESSAGE", "push_parser"]
