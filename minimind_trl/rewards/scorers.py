"""Scorers: reward models behind one interface, `score(conversations) -> list[float]`.

`RewardModelReward` (`minimind_trl.rewards.reward_model`) hands a scorer every conversation of a batch at once; the
scorer batches them through the model. Batching must not change a score: each sequence keeps positions
0..L-1 and is read at its own last real token whatever the padding, so batched scores equal one-at-a-time
scores (up to float rounding of differently shaped matmuls).

* `InternLM2Scorer`: InternLM2-style reward models (upstream's `internlm2-1_8b-reward`): the conversation is
  rendered with the reward tokenizer's chat template, tokenized without extra specials, the reward token is
  appended (unless the template already ends with it) and the model's score at that token is read. Works with
  `minimind_trl.models.internlm2_reward.InternLM2ForRewardModel` and with any model whose `forward(input_ids,
  attention_mask, position_ids)` returns that score as `logits`; a model object that only offers the published
  remote-code `get_score(tokenizer, messages)` is scored one conversation at a time through it.
* `SequenceClassifierScorer`: any `AutoModelForSequenceClassification` reward model with `num_labels=1`,
  scored the way TRL scores such models (chat template, no extra specials, right padding, `logits[:, 0]`).

Both keep a conversation within the reward model's positions (`max_length`, by default its config's
`max_position_embeddings`): a longer one is cut from the left to its last `max_length` tokens, the way upstream cuts
the policy's prompts (`input_ids[:, -max_seq_len:]`), so the oldest prompt text goes first and the completion and
the reward token stay; a warning says so once per scorer. Upstream hands its reward model the whole text, where one
outlier row (a 100 KB prompt) asks for tens of GB at step 1 and a conversation past the model's positions is
scored where the model was never trained.
"""

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import RewardSpecError
from ..models.internlm2_reward import load_internlm2_reward_model, load_internlm2_tokenizer, reward_token_ids
from .rule_rewards import Conversation


logger = logging.getLogger(__name__)


def model_positions(model: Any) -> int | None:
    """The positions a reward model was built for (`config.max_position_embeddings`), or None if it says none."""
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return positions if isinstance(positions, int) and positions > 0 else None


class LeftTruncation:
    """Cuts token sequences to their last `max_length` ids (None: no limit) and warns the first time it cuts."""

    def __init__(self, max_length: int | None, owner: str):
        if max_length is not None and max_length < 2:
            raise ValueError(f"max_length must be at least 2 tokens (or None), got {max_length}")
        self.max_length = max_length
        self.owner = owner
        self.warned = False

    def __call__(self, sequences: list[list[int]]) -> list[list[int]]:
        limit = self.max_length
        longest = max((len(ids) for ids in sequences), default=0)
        if limit is None or longest <= limit:
            return sequences
        if not self.warned:
            cut = sum(len(ids) > limit for ids in sequences)
            logger.warning(
                "%s: %d of %d reward-model inputs are longer than the reward model's %d positions (the longest has "
                "%d tokens); each is cut from the left to its last %d tokens (the oldest prompt text goes, the "
                "completion and the reward token stay), as upstream cuts the policy's prompts. Said once; later "
                "cuts are silent.",
                self.owner, cut, len(sequences), limit, longest, limit,
            )  # fmt: skip
            self.warned = True
        return [ids[-limit:] for ids in sequences]


def _model_device(model: torch.nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _render(tokenizer: Any, conversation: Conversation) -> str:
    return tokenizer.apply_chat_template(list(conversation), tokenize=False, add_generation_prompt=False)


def pad_token_ids(sequences: Sequence[Sequence[int]], pad_id: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad token-id lists to a [B, T] batch and its attention mask, on the given side."""
    width = max(len(ids) for ids in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, ids in enumerate(sequences):
        span = slice(0, len(ids)) if side == "right" else slice(width - len(ids), width)
        input_ids[row, span] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, span] = 1
    return input_ids, attention_mask


def _in_length_batches(sequences: Sequence[Sequence[int]], batch_size: int, run: Callable[[list[int]], list[float]]) -> list[float]:
    """Run `run(indices)` on batches of similar length (longest first) and return scores in input order."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]), reverse=True)
    scores: list[float] = [0.0] * len(sequences)
    for start in range(0, len(order), batch_size):
        indices = order[start : start + batch_size]
        for index, value in zip(indices, run(indices)):
            scores[index] = value
    return scores


class InternLM2Scorer:
    """Scores conversations with an InternLM2-style reward model (reward token appended, score read there).

    Args:
        model: an `InternLM2ForRewardModel` (or any model with `config.reward_token_id` whose forward takes
            `input_ids`, `attention_mask`, `position_ids` and returns the score at the last real position as
            `logits`), or an object with the published `get_score(tokenizer, messages)` only.
        tokenizer: the reward model's tokenizer (`minimind_trl.models.internlm2_reward.load_internlm2_tokenizer`), with
            its chat template.
        batch_size: conversations per forward pass.
        padding_side: `"right"` (default) or `"left"`; positions are computed from the attention mask either
            way, so the side does not change a score.
        reward_token_id: overrides `model.config.reward_token_id`.
        max_length: the most tokens one conversation keeps (cut from the left, see the module doc); default the
            model's `max_position_embeddings`, None when it records none.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        batch_size: int = 8,
        padding_side: str = "right",
        reward_token_id: int | None = None,
        max_length: int | None = None,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
        if reward_token_id is None:
            reward_token_id = getattr(getattr(model, "config", None), "reward_token_id", None)
        self.batched = isinstance(model, torch.nn.Module) and reward_token_id is not None
        if not self.batched and not callable(getattr(model, "get_score", None)):
            raise TypeError(
                "InternLM2Scorer needs a reward model with `config.reward_token_id` (batched scoring) or a "
                f"`get_score(tokenizer, messages)` method; {type(model).__name__} has neither"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.padding_side = padding_side
        self.reward_token_id = reward_token_id
        self.truncation = LeftTruncation(max_length or model_positions(model), "InternLM2Scorer")

    @classmethod
    def from_pretrained(
        cls,
        path_or_repo: str | os.PathLike,
        *,
        dtype: torch.dtype | str | None = None,
        device: torch.device | str | None = None,
        attn_implementation: str = "sdpa",
        revision: str | None = None,
        **kwargs,
    ) -> "InternLM2Scorer":
        """Load the native model and tokenizer from a folder or Hub repo (e.g. `internlm/internlm2-1_8b-reward`)."""
        model = load_internlm2_reward_model(
            path_or_repo, dtype=dtype, device=device, attn_implementation=attn_implementation, revision=revision
        )
        return cls(model, load_internlm2_tokenizer(path_or_repo, revision=revision), **kwargs)

    def token_ids(self, conversation: Conversation) -> list[int]:
        """The ids the model sees: the rendered conversation (no extra specials) ending with the reward token."""
        return reward_token_ids(self.tokenizer, conversation, self.reward_token_id)

    def score(self, conversations: list[Conversation]) -> list[float]:
        if not conversations:
            return []
        if not self.batched:
            return [float(self.model.get_score(self.tokenizer, list(conversation))) for conversation in conversations]
        sequences = self.truncation([self.token_ids(conversation) for conversation in conversations])
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.reward_token_id
        device = _model_device(self.model)

        def run(indices: list[int]) -> list[float]:
            input_ids, attention_mask = pad_token_ids([sequences[i] for i in indices], pad_id, self.padding_side)
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
            with torch.inference_mode():
                logits = self.model(
                    input_ids=input_ids.to(device),
                    attention_mask=attention_mask.to(device),
                    position_ids=position_ids.to(device),
                ).logits
            return logits.reshape(len(indices), -1)[:, 0].float().tolist()

        return _in_length_batches(sequences, self.batch_size, run)


class SequenceClassifierScorer:
    """Scores conversations with an `AutoModelForSequenceClassification` reward model (`num_labels=1`).

    The conversation is rendered with the tokenizer's chat template and tokenized without extra specials;
    batches are right-padded and the score is `logits[:, 0]`, which the model reads at the last non-pad token
    (`config.pad_token_id` must be set), as TRL does for reward models passed as modules. `max_length` as for
    `InternLM2Scorer`.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, batch_size: int = 8, max_length: int | None = None):
        num_labels = getattr(model.config, "num_labels", None)
        if num_labels != 1:
            raise ValueError(f"a reward model must have num_labels=1, {type(model).__name__} has {num_labels}")
        if tokenizer.pad_token_id is None or model.config.pad_token_id is None:
            raise ValueError(
                "SequenceClassifierScorer needs a pad token on both the tokenizer and model.config.pad_token_id "
                "(the model finds each row's last token through it); set them, e.g. to the eos token"
            )
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("SequenceClassifierScorer needs a tokenizer with a chat template to render conversations")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.truncation = LeftTruncation(max_length or model_positions(model), "SequenceClassifierScorer")

    @classmethod
    def from_pretrained(
        cls,
        path_or_repo: str | os.PathLike,
        *,
        dtype: torch.dtype | str | None = None,
        device: torch.device | str | None = None,
        revision: str | None = None,
        batch_size: int = 8,
    ) -> "SequenceClassifierScorer":
        """Load a reward model and its tokenizer with the Auto classes (no remote code), frozen, in eval mode.

        dtype None: float32 on CPU, the checkpoint's dtype elsewhere. A tokenizer without a pad token gets its
        eos token as pad (as TRL does for reward models)."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        device = torch.device(device or "cpu")
        if dtype is None:
            dtype = torch.float32 if device.type == "cpu" else "auto"
        model, info = AutoModelForSequenceClassification.from_pretrained(
            path_or_repo, dtype=dtype, revision=revision, output_loading_info=True
        )
        missing = sorted(map(str, info.get("missing_keys") or []))
        if missing:  # transformers would initialise them at random: every score a random projection
            raise RewardSpecError(
                f"reward model {path_or_repo}: its weights have no {', '.join(missing[:4])} (initialised at random on "
                "load), so it is not a trained reward model (a policy folder whose config.json claims a "
                "sequence-classification architecture?)"
            )
        tokenizer = AutoTokenizer.from_pretrained(path_or_repo, revision=revision)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        model = model.to(device).eval().requires_grad_(False)
        return cls(model, tokenizer, batch_size=batch_size)

    def score(self, conversations: list[Conversation]) -> list[float]:
        if not conversations:
            return []
        sequences = self.truncation([
            list(self.tokenizer(_render(self.tokenizer, conversation), add_special_tokens=False)["input_ids"])
            for conversation in conversations
        ])
        device = _model_device(self.model)

        def run(indices: list[int]) -> list[float]:
            pad_id = self.model.config.pad_token_id
            input_ids, attention_mask = pad_token_ids([sequences[i] for i in indices], pad_id, "right")
            with torch.inference_mode():
                logits = self.model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).logits
            return logits[:, 0].float().tolist()

        return _in_length_batches(sequences, self.batch_size, run)


__all__ = ["InternLM2Scorer", "LeftTruncation", "SequenceClassifierScorer", "model_positions"]
