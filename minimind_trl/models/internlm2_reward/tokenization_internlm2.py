"""InternLM2's SentencePiece tokenizer as a transformers fast tokenizer, without remote code.

The published `internlm2-1_8b-reward` ships `tokenizer.model` (SentencePiece BPE with byte fallback), a
`tokenizer_config.json` that renames a few SentencePiece pieces to chat specials (92543 `<|im_start|>`,
92542 `<|im_end|>`, 92527 `<|reward|>`, ...) and remote tokenizer classes (`auto_map`), so `AutoTokenizer`
wants `trust_remote_code` (and stops to ask for it) and the remote classes were written for transformers 4.
Rather than depend on how a given transformers version converts such a folder, this module builds the
tokenizer from the SentencePiece proto itself with transformers' `SpmConverter.build_tokenizer_from_spm_proto`
(which follows the model's own normalizer settings and user-defined pieces) and then:

* renames pieces to the specials of `added_tokens_decoder` at their ids, and registers them as special
  added tokens (split out of the text before SentencePiece sees it, as the published slow tokenizer does);
* encodes every stretch of text between specials like `SentencePieceProcessor.encode` on that stretch
  (the published slow tokenizer's behaviour: a dummy prefix, if the model has one, starts every stretch);
* sets bos/eos/unk/pad (`<s>`, `</s>`, `<unk>`, `</s>`), `add_bos_token` and the chat template from the
  config (published: `{{ bos_token }}` + `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message
  (+ generation prompt) + `<|reward|>`).
"""

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenizers import AddedToken
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import SpmConverter, import_protobuf

from .loading import resolve_model_folder

# The published chat template, without the trailing reward token (scorers append `reward_token_id` anyway).
INTERNLM2_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# The published `added_tokens_decoder` of internlm2-1_8b-reward (used when no tokenizer_config.json is given).
INTERNLM2_SPECIAL_TOKENS = {
    0: "<unk>",
    1: "<s>",
    2: "</s>",
    92527: "<|reward|>",
    92538: "<|plugin|>",
    92539: "<|interpreter|>",
    92540: "<|action_end|>",
    92541: "<|action_start|>",
    92542: "<|im_end|>",
    92543: "<|im_start|>",
}
_SPM_BPE = 2  # sentencepiece ModelProto.TrainerSpec.ModelType.BPE


def _token_content(token: Any) -> str:
    if isinstance(token, str):
        return token
    if isinstance(token, Mapping) and isinstance(token.get("content"), str):
        return token["content"]
    raise ValueError(f"expected a token string or {{'content': ...}}, got {token!r}")


def build_internlm2_tokenizer(
    sentencepiece_model: str | os.PathLike, tokenizer_config: Mapping[str, Any] | None = None
) -> PreTrainedTokenizerFast:
    """A fast tokenizer from InternLM2's `tokenizer.model` and (optionally) its `tokenizer_config.json` contents.

    Without `tokenizer_config`, the published reward model's specials and the chat template above are used
    (specials whose id is beyond the SentencePiece vocabulary are an error).
    """
    model_file = Path(sentencepiece_model)
    proto = import_protobuf("Reading InternLM2's tokenizer.model (protobuf is a minimind-trl dependency)").ModelProto()
    proto.ParseFromString(model_file.read_bytes())
    if proto.trainer_spec.model_type != _SPM_BPE:
        raise ValueError(f"{model_file}: InternLM2's tokenizer is a SentencePiece BPE model (model_type BPE)")
    config = dict(tokenizer_config or {})

    if "added_tokens_decoder" in config:
        added = {int(index): token for index, token in config["added_tokens_decoder"].items()}
    else:
        added = {index: {"content": content, "special": True} for index, content in INTERNLM2_SPECIAL_TOKENS.items()}
    pieces = [piece.piece for piece in proto.pieces]
    for index, token in added.items():
        if not 0 <= index < len(pieces):
            raise ValueError(f"{model_file}: special token id {index} is outside the vocabulary of {len(pieces)} pieces")
        pieces[index] = _token_content(token)
    vocab = {piece: index for index, piece in enumerate(pieces)}
    if len(vocab) != len(pieces):
        raise ValueError(f"{model_file}: renaming pieces to the special tokens made duplicate pieces")

    backend = SpmConverter.build_tokenizer_from_spm_proto(proto, vocab, merges=None, legacy=True)
    backend.add_special_tokens(
        [
            AddedToken(
                _token_content(token),
                special=bool(token.get("special", True)) if isinstance(token, Mapping) else True,
                normalized=False,
                lstrip=bool(token.get("lstrip", False)) if isinstance(token, Mapping) else False,
                rstrip=bool(token.get("rstrip", False)) if isinstance(token, Mapping) else False,
                single_word=bool(token.get("single_word", False)) if isinstance(token, Mapping) else False,
            )
            for _, token in sorted(added.items())
        ]
    )
    named = {key: _token_content(config[key]) for key in ("bos_token", "eos_token", "unk_token", "pad_token") if config.get(key)}
    named.setdefault("bos_token", "<s>")
    named.setdefault("eos_token", "</s>")
    named.setdefault("unk_token", "<unk>")
    named.setdefault("pad_token", "</s>")
    extra = [_token_content(token) for token in config.get("additional_special_tokens", [])]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        add_bos_token=bool(config.get("add_bos_token", True)),
        add_eos_token=bool(config.get("add_eos_token", False)),
        clean_up_tokenization_spaces=False,
        extra_special_tokens=extra,
        **named,
    )
    for token in [*named.values(), *extra]:
        if token not in vocab:
            raise ValueError(f"{model_file}: special token {token!r} is not a piece of the vocabulary")
    tokenizer.chat_template = config.get("chat_template") or INTERNLM2_CHAT_TEMPLATE
    return tokenizer


def load_internlm2_tokenizer(path_or_repo: str | os.PathLike, revision: str | None = None) -> PreTrainedTokenizerFast:
    """The tokenizer of an InternLM2 folder or Hub repo (`tokenizer.model` + optional `tokenizer_config.json`)."""
    folder = resolve_model_folder(path_or_repo, revision, allow_patterns=["tokenizer.model", "*.json"])
    model_file = folder / "tokenizer.model"
    if not model_file.is_file():
        raise FileNotFoundError(f"{folder}: tokenizer.model is missing")
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else None
    return build_internlm2_tokenizer(model_file, config)


__all__ = ["INTERNLM2_CHAT_TEMPLATE", "INTERNLM2_SPECIAL_TOKENS", "build_internlm2_tokenizer", "load_internlm2_tokenizer"]
