"""`minimind-trl push OUTPUT_DIR --hub_model_id you/name`: push a run's output folder to the Hugging Face Hub later.

For a run whose push failed (`minimind-trl grpo` exited with 3) or one trained without `--push_to_hub`. It sends
what the run's own final push sends (huggingface_hub's `upload_folder`, the Trainer's ignore patterns): everything at
the top of the folder (the model or LoRA adapter, tokenizer, modeling code, model card, `training_args.bin`, with
`save_native_pth` the native `.pth` and its `.config.json`), but not the `checkpoint-N` folders nor `_`-prefixed
entries (the run's lock `_minimind_run.lock`, `_staging`, a native policy's conversion `_base_model`).
"""

import os

from minimind_trl_cli.hub import PUSH_COMMIT_MESSAGE, push_parser

from ..errors import HubError, PushCheckError, RecipeError


def push(output_dir: str, hub_model_id: str, private: bool | None = None, revision: str | None = None,
         commit_message: str = PUSH_COMMIT_MESSAGE) -> str:  # fmt: skip
    """Check `output_dir` (a finished model or adapter that loads without minimind-trl, no run writing it), make or
    find the repository and upload the folder; returns the commit's URL. Every failure is one `MiniMindTRLError`."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    from ..hub_uploads import HUB_FAILURES, create_hub_repo, failure_line, hub_endpoint, remedy, upload_output_folder
    from ..trainer.outputs.run_lock import check_output_dir_free
    from .hub import check_push_folder

    if not os.path.isdir(output_dir):
        raise PushCheckError(f"{output_dir} is not a folder (give the output_dir of a finished run)")
    try:
        validate_repo_id(hub_model_id)
    except HFValidationError as exc:
        raise RecipeError(f"--hub_model_id {hub_model_id!r} is not a Hub repository id ({exc})") from None
    check_output_dir_free(output_dir)  # a live run's folder is refused: its final model is not there yet
    check_push_folder(output_dir)
    repo_id = create_hub_repo(hub_model_id, private=private, asked_by="push", otherwise="then run this command again")
    try:
        commit = upload_output_folder(output_dir, repo_id, revision=revision, message=commit_message)
    except HUB_FAILURES as exc:
        raise HubError(
            f"the push of {output_dir} to {repo_id} on the Hugging Face Hub ({hub_endpoint()}) failed: "
            f"{failure_line(exc)}. {remedy(exc)}, then run this command again ({output_dir} is unchanged)"
        ) from exc
    return str(getattr(commit, "commit_url", None) or f"{hub_endpoint()}/{repo_id}")


def main(argv: list[str] | None = None) -> int:
    """`minimind-trl push`; failures raise `MiniMindTRLError` (the `minimind-trl` command reports them, exit 2)."""
    args = push_parser().parse_args(argv)
    url = push(args.output_dir, args.hub_model_id, private=args.hub_private_repo or None,
               revision=args.hub_revision, commit_message=args.commit_message)  # fmt: skip
    print(f"pushed {args.output_dir} to {url}")
    return 0


__all__ = ["main", "push"]
