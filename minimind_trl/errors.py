"""The errors a user can act on: bad input, named in the message.

Every such error derives from `MiniMindTRLError` (a `ValueError`, so existing `except ValueError` code keeps
working). The `minimind-trl` command catches it once, prints `minimind-trl <command>: error: <message>` and
exits with 2, argparse's code for a usage error; anything else is a bug and keeps its traceback.
`minimind-trl grpo` exits with 3 when training finished and every local output was written but a push to the Hub
failed (`PUSH_FAILED_EXIT_CODE`; the failures are listed on stderr).
"""

from minimind_trl_cli.process_exit import USER_ERROR_EXIT_CODE  # also the front door's, which answers without torch

PUSH_FAILED_EXIT_CODE = 3


class MiniMindTRLError(ValueError):
    """Bad input: a recipe, path, checkpoint, dataset, reward or option that cannot be used as given."""


class RecipeError(MiniMindTRLError):
    """A recipe or command line that cannot be parsed; the message names the file, line or key."""


class ModelSourceError(MiniMindTRLError):
    """A policy or tokenizer location that cannot be used; the message names the argument."""


class RLAIFDataError(MiniMindTRLError):
    """RLAIF data that cannot be turned into prompts; the message names the file and line (or row)."""


class DatasetSplitError(RLAIFDataError):
    """A split a data source does not have; the message names the source and the splits it has (the command adds
    the key that asked for it: `dataset_train_split`, `dataset_test_split`)."""


class AgentDataError(RLAIFDataError):
    """Agent RL rows (`conversations`, the system turn's `tools`, `gt`) that cannot be used; the message names the
    file and line (or row), the turn or the key."""


class ToolSpecError(MiniMindTRLError):
    """A tool name, function or timeout that cannot be used; the message names it."""


class RewardSpecError(MiniMindTRLError):
    """A reward name, weight or reward model that cannot be used; the message names it."""


class RewardFunctionError(RewardSpecError):
    """A reward function that raised or returned something other than one finite number (or None) per completion."""


class ExtensionError(MiniMindTRLError):
    """A loss, advantage estimator or loss aggregation that cannot be registered or imported as named, or that
    returned what the trainer cannot use; the message names the config key, the value or the function."""


class ResumeError(MiniMindTRLError):
    """A checkpoint that cannot be resumed with the current arguments."""


class OutputDirError(MiniMindTRLError):
    """An output folder another run holds or has written to, or one that cannot be written; the message names it."""


class PushCheckError(MiniMindTRLError):
    """A folder that would reach the Hub without what people need to load it."""


class HubError(MiniMindTRLError):
    """The Hugging Face Hub cannot be reached or refuses the repository; the message names the Hub and what to do."""


class ConversionError(MiniMindTRLError):
    """A checkpoint, option or output path that cannot be converted; the message says which and why."""


class ExportError(ConversionError):
    """The model cannot be written in the requested format; the message says why and what can."""


class MergeError(MiniMindTRLError):
    """An adapter, base model or output folder that cannot be merged; the message names it."""


class DemoError(MiniMindTRLError):
    """A demo invocation that cannot run (the message says why)."""


class VLLMModelError(MiniMindTRLError):
    """A MiniMind model vLLM cannot run as its native Llama / Qwen3 / Qwen3-MoE; the message names the folder."""


__all__ = [
    "PUSH_FAILED_EXIT_CODE",
    "USER_ERROR_EXIT_CODE",
    "AgentDataError",
    "ConversionError",
    "DatasetSplitError",
    "DemoError",
    "ExportError",
    "ExtensionError",
    "HubError",
    "MergeError",
    "MiniMindTRLError",
    "ModelSourceError",
    "OutputDirError",
    "PushCheckError",
    "RLAIFDataError",
    "RecipeError",
    "ResumeError",
    "RewardFunctionError",
    "RewardSpecError",
    "ToolSpecError",
    "VLLMModelError",
]
