"""MiniMind-3's per-prompt rendering of RLAIF prompts: `thinking_ratio` and the random system prompt.

MiniMind-3's `RLAIFDataset` (upstream d65ef2c) renders every prompt when it is read: with probability
`thinking_ratio` (upstream default 0.9) the chat template opens a thought (`open_thinking=True`, the prompt ends
in `<think>\\n`), else it renders the closed empty thought; before that, `pre_processing_chat` gives 20 % of the
conversations without a system turn one of ten fixed system prompts (`SYSTEM_PROMPTS`).

TRL 1.16's `GRPOTrainer` renders conversational prompts with one `chat_template_kwargs` for all rows, so a
per-prompt choice means handing TRL prompts that are already rendered: text. TRL tokenizes that text as it is and
passes the same text to the reward functions, so the rewards parse exactly the prompt the policy saw.

Upstream draws from Python's global generator at every read; here each choice is a function of `(seed, epoch,
row, what)` only (`keyed_uniform`), so a resumed run renders the same prompt for the same row in the same epoch,
every process agrees, and the two choices are independent of each other. `with_rendered_prompts` attaches a
`PromptRenderer` as a `datasets` transform: a row is rendered when the trainer reads it, with the epoch
`MiniMindGRPOTrainer` sets at the start of every epoch (`PromptRenderer.set_epoch`).
"""

from __future__ import annotations  # `datasets` only in annotations: `grpo --help` imports none of it

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from .errors import RecipeError

if TYPE_CHECKING:
    import datasets

# Upstream's `pre_processing_chat` (d65ef2c, dataset/lm_dataset.py): the system prompts and the share of
# conversations without a system turn that get one.
SYSTEM_PROMPTS = (
    "你是一个知识丰富的AI，尽力为用户提供准确的信息。",
    "你是minimind，一个小巧但有用的语言模型。",
    "你是一个专业的AI助手，请提供有价值的回答。",
    "你是minimind，请尽力帮助用户解决问题。",
    "你是一个可靠的AI，请给出准确的回答。",
    "You are a helpful AI assistant.",
    "You are minimind, a lightweight intelligent assistant.",
    "You are a friendly chatbot. Please answer the user's questions carefully.",
    "You are a knowledgeable AI. Try your best to provide accurate information.",
    "You are minimind, a small but useful language model.",
)
UPSTREAM_SYSTEM_PROMPT_RATIO = 0.2
UPSTREAM_THINKING_RATIO = 0.9  # train_grpo.py --thinking_ratio
ROW_COLUMN = "prompt_row"  # the dataset row index each choice is keyed on
OPEN_THINKING_KWARG = "open_thinking"


def check_ratio(key: str, value) -> None:
    """A probability, or a `ValueError` naming `key`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{key} must be a number between 0 and 1, got {value!r}")


@dataclass(frozen=True)
class PromptRendering:
    """How each prompt is rendered.

    Args:
        thinking_ratio: probability that a prompt is rendered with `open_thinking=True` (else `False`);
            `None` passes no `open_thinking` (the template's default). Upstream MiniMind-3: 0.9.
        system_prompt_ratio: probability that a prompt without a system turn gets one of `SYSTEM_PROMPTS`
            (upstream MiniMind-3: 0.2, `pre_processing_chat`); 0 adds none.
        seed: the seed every choice is keyed on (the run's `seed`).
    """

    thinking_ratio: float | None = None
    system_prompt_ratio: float = 0.0
    seed: int = 42

    def __post_init__(self):
        if self.thinking_ratio is not None:
            check_ratio("thinking_ratio", self.thinking_ratio)
        check_ratio("system_prompt_ratio", self.system_prompt_ratio)

    @property
    def per_prompt(self) -> bool:
        """Whether any choice is made per prompt (else TRL renders the conversational prompts itself)."""
        return self.thinking_ratio is not None or self.system_prompt_ratio > 0


def keyed_uniform(seed: int, epoch: int, row: int, what: str) -> float:
    """A uniform draw in [0, 1) that depends only on its key (`random.Random` seeds strings through SHA-512, the
    same in every process and Python session)."""
    return random.Random(f"{seed}/{epoch}/{row}/{what}").random()


def choose_open_thinking(rendering: PromptRendering, epoch: int, row: int) -> bool | None:
    """`open_thinking` for this row in this epoch (None when `thinking_ratio` is off)."""
    if rendering.thinking_ratio is None:
        return None
    return keyed_uniform(rendering.seed, epoch, row, "open_thinking") < rendering.thinking_ratio


def choose_system_prompt(rendering: PromptRendering, epoch: int, row: int, messages: Sequence[Mapping]) -> str | None:
    """The system prompt added to this row in this epoch, or None (off, not drawn, or the row has a system turn)."""
    if rendering.system_prompt_ratio <= 0 or (messages and messages[0].get("role") == "system"):
        return None
    if keyed_uniform(rendering.seed, epoch, row, "system_prompt") >= rendering.system_prompt_ratio:
        return None
    pick = random.Random(f"{rendering.seed}/{epoch}/{row}/system_prompt_choice").randrange(len(SYSTEM_PROMPTS))
    return SYSTEM_PROMPTS[pick]


def render_prompt(
    tokenizer: Any,
    messages: Sequence[Mapping],
    *,
    open_thinking: bool | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The prompt text the policy generates from: the chat template with the generation prompt."""
    kwargs = dict(chat_template_kwargs or {})
    if open_thinking is not None:
        kwargs[OPEN_THINKING_KWARG] = open_thinking
    return tokenizer.apply_chat_template(
        [dict(message) for message in messages], tokenize=False, add_generation_prompt=True, **kwargs
    )


class PromptRenderer:
    """The `datasets` transform that renders each row's `prompt` messages to text, keyed on its row and the epoch.

    Output rows carry `prompt` (the rendered text), `open_thinking` and `system_prompt` (the choices, also passed
    to reward functions as keyword arguments) and every other column unchanged.
    """

    def __init__(self, tokenizer: Any, rendering: PromptRendering, chat_template_kwargs: Mapping | None = None):
        self.tokenizer = tokenizer
        self.rendering = rendering
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Render the rows read from now on for this epoch (the trainer calls this at every epoch start)."""
        self.epoch = int(epoch)

    def render_row(self, messages: Sequence[Mapping], row: int, epoch: int | None = None) -> dict:
        """`{"prompt": text, "open_thinking": ..., "system_prompt": ...}` for one row."""
        epoch = self.epoch if epoch is None else epoch
        system_prompt = choose_system_prompt(self.rendering, epoch, row, messages)
        if system_prompt is not None:
            messages = [{"role": "system", "content": system_prompt}, *messages]
        open_thinking = choose_open_thinking(self.rendering, epoch, row)
        text = render_prompt(
            self.tokenizer, messages, open_thinking=open_thinking, chat_template_kwargs=self.chat_template_kwargs
        )
        return {"prompt": text, "open_thinking": open_thinking, "system_prompt": system_prompt}

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        rendered = [self.render_row(messages, row) for messages, row in zip(batch["prompt"], batch[ROW_COLUMN])]
        output = {key: values for key, values in batch.items() if key != "prompt"}
        for key in ("prompt", "open_thinking", "system_prompt"):
            output[key] = [row[key] for row in rendered]
        return output


def _template_text(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    return template if isinstance(template, str) else json.dumps(template or "")


def with_rendered_prompts(
    dataset: datasets.Dataset,
    tokenizer: Any,
    rendering: PromptRendering,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> datasets.Dataset:
    """`dataset` (conversational `prompt` column) whose rows are rendered per prompt when read (`PromptRenderer`).

    Raises `RecipeError` when the result could not be what the policy sees: a template that ignores
    `open_thinking`, `open_thinking` also set in `chat_template_kwargs`, or a tokenizer that adds special tokens
    to plain text (TRL would add them to the rendered prompts, which chat-template tokenization does not)."""
    kwargs = dict(chat_template_kwargs or {})
    if "prompt" not in dataset.column_names or ROW_COLUMN in dataset.column_names:
        raise RecipeError(
            f"per-prompt rendering needs a 'prompt' column of messages and no {ROW_COLUMN!r} column; the dataset has "
            f"{dataset.column_names}"
        )
    if rendering.thinking_ratio is not None:
        if OPEN_THINKING_KWARG in kwargs:
            raise RecipeError(
                f"thinking_ratio={rendering.thinking_ratio} chooses open_thinking per prompt, but chat_template_kwargs "
                f"also sets open_thinking={kwargs[OPEN_THINKING_KWARG]!r}; drop one of them"
            )
        if OPEN_THINKING_KWARG not in _template_text(tokenizer):
            raise RecipeError(
                f"thinking_ratio={rendering.thinking_ratio} needs a chat template that reads `open_thinking` "
                "(MiniMind-3's); this tokenizer's template does not, so every prompt would render the same"
            )
    first = dataset[0]["prompt"] if len(dataset) else None
    if not (isinstance(first, list) and all(isinstance(message, Mapping) for message in first)):
        raise RecipeError(
            "per-prompt rendering (thinking_ratio, system_prompt_ratio) renders conversational prompts, but the "
            f"dataset's first prompt is {type(first).__name__} {str(first)[:80]!r}, not a list of messages"
        )
    sample = render_prompt(tokenizer, first, chat_template_kwargs=kwargs)
    if tokenizer(sample)["input_ids"] != tokenizer(sample, add_special_tokens=False)["input_ids"]:
        raise RecipeError(
            "per-prompt rendering hands TRL rendered text, which TRL tokenizes with the tokenizer's special tokens "
            "(e.g. a BOS) that chat-template tokenization leaves out; this tokenizer adds some: use thinking_ratio "
            "and system_prompt_ratio with a tokenizer that adds none (MiniMind's)"
        )
    indexed = dataset.add_column(ROW_COLUMN, list(range(len(dataset))))
    rendered = indexed.with_transform(PromptRenderer(tokenizer, rendering, kwargs))
    # `datasets` would hash the renderer object, tokenizer included, and so the spelling of the path it was loaded
    # from (a trailing slash, a symlink): a resume would be refused as a change of data. What renders a row is this.
    rendered._fingerprint = _digest([indexed._fingerprint, asdict(rendering), tokenizer_digest(tokenizer), kwargs])
    return rendered


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def tokenizer_digest(tokenizer: Any) -> str:
    """A hash of what renders and tokenizes a prompt (vocabulary, special tokens, chat template), not of where the
    tokenizer was loaded from."""
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's text tokenizer
    return _digest([sorted(tokenizer.get_vocab().items()), tokenizer.all_special_tokens, _template_text(tokenizer)])


def render_per_prompt(
    dataset: datasets.Dataset | None,
    tokenizer: Any,
    rendering: PromptRendering,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> datasets.Dataset | None:
    """`dataset` with each prompt rendered per row (`with_rendered_prompts`) when `rendering` chooses per prompt, or
    unchanged (also None, a run without held-out prompts). Held-out prompts render as in the first epoch at every
    evaluation."""
    if dataset is None or not rendering.per_prompt:
        return dataset
    return with_rendered_prompts(dataset, tokenizer, rendering, chat_template_kwargs)


def prompt_renderer(dataset: Any) -> PromptRenderer | None:
    """The `PromptRenderer` a dataset renders its rows with, if any."""
    format_ = getattr(dataset, "format", None)
    if not isinstance(format_, Mapping):
        return None
    transform = (format_.get("format_kwargs") or {}).get("transform")
    return transform if isinstance(transform, PromptRenderer) else None


__all__ = [
    "OPEN_THINKING_KWARG",
    "ROW_COLUMN",
    "SYSTEM_PROMPTS",
    "UPSTREAM_SYSTEM_PROMPT_RATIO",
    "UPSTREAM_THINKING_RATIO",
    "PromptRenderer",
    "PromptRendering",
    "check_ratio",
    "choose_open_thinking",
    "choose_system_prompt",
    "keyed_uniform",
    "prompt_renderer",
    "render_per_prompt",
    "render_prompt",
    "with_rendered_prompts",
]
