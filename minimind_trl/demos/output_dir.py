"""The demos' output folder: what a demo run writes there, and replacing an earlier run's outputs without ever
deleting what a demo did not write. Shared by `minimind-trl demo` and `demo --agent` (`default`, `agent`)."""

import atexit
import json
import re
import shutil
from pathlib import Path

from ..errors import DemoError

RUN_MARKER = "demo_run.json"  # marks a folder as a demo run, which a new demo run may replace

# What a demo run writes into its folder (the model folder, checkpoints, Ctrl-C saves, metrics, the run's lock).
DEMO_OUTPUTS = re.compile(
    r"^(demo_run\.json|metrics\.jsonl|reward_curve\.png|summary\.json|README\.md|_warm_start(\.sft)?|_reward_model|"
    r"_grpo_prompts\.jsonl|_agent_prompts\.jsonl|_held_out\.jsonl|_staging|_minimind_run\.lock|"
    r"checkpoint-\d+|interrupted-step-\d+(\.tmp)?|grpo_\d+(_moe)?(\.pth|\.config\.json)|"
    r"config\.json|generation_config\.json|"
    r"model(-\d+-of-\d+)?\.safetensors(\.index\.json)?|(configuration|modeling)_minimind\.py|tokenizer(_config)?\.json|"
    r"special_tokens_map\.json|chat_template\.jinja|training_args\.bin)$"
)


def prepare_output_dir(output_dir: Path) -> None:
    """Create `output_dir`; in an earlier demo run's folder, replace what the demo wrote, and refuse when anything
    else is there (files someone added since): never delete what the demo did not write."""
    from ..trainer.outputs.run_lock import LOCK_NAME, output_dir_lock

    try:
        if output_dir.exists() and any(output_dir.iterdir()) and not (output_dir / RUN_MARKER).is_file():
            raise DemoError(
                f"--output_dir {output_dir} exists and is not an earlier demo run; pick another --output_dir"
            )
        output_dir.mkdir(parents=True, exist_ok=True)
        # Held until the process ends (one demo, one process): a second demo into this folder is refused instead
        # of deleting the files of the one running. Re-entered by the GRPO run (`grpo.run`). Kept referenced by
        # `atexit` (a dropped context manager is collected at once, and its cleanup releases the lock), which
        # releases it and removes the lock file when the process ends.
        lock = output_dir_lock(str(output_dir))
        lock.__enter__()
        atexit.register(lock.__exit__, None, None, None)
        entries = [entry for entry in output_dir.iterdir() if entry.name != LOCK_NAME]
        others = sorted(entry.name for entry in entries if not DEMO_OUTPUTS.match(entry.name))
        if others:
            shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
            raise DemoError(
                f"--output_dir {output_dir} holds an earlier demo run and things the demo did not write ({shown}); "
                "move them out or pick another --output_dir (the demo replaces only its own outputs)"
            )
        for entry in entries:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        (output_dir / RUN_MARKER).write_text(json.dumps({"command": "minimind-trl demo"}) + "\n")
    except OSError as exc:
        raise DemoError(f"--output_dir {output_dir}: cannot write there ({exc.strerror}: {exc.filename})") from exc


__all__ = ["DEMO_OUTPUTS", "RUN_MARKER", "prepare_output_dir"]
