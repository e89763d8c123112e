"""The demo's ingredients: its bundled data, its MiniMind-style tokenizer and tiny model, and sampling the way GRPO
samples (for the warm start's layout probe, the reward model's pairs and the before/after summaries), and a model
saved as a folder without leaving a half-written one behind.
"""

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
PROMPTS_FILE = DATA_DIR / "demo_prompts.jsonl"
FORMAT_EXAMPLES_FILE = DATA_DIR / "demo_format_examples.jsonl"
SAMPLE_PROMPTS = ("What is 7 plus 5?", "法国的首都是哪里？", "What is the opposite of hot?", "狗有几条腿？")


@dataclass(frozen=True)
class DemoModel:
    """The demo's MiniMind: small enough that a GRPO step (32 completions of 32 tokens) takes a fraction of a
    second on one CPU core; everything else is MiniMindConfig's default for the generation (MiniMind2 unless
    `--upstream minimind3`: then q/k norms and MiniMind-3's MLP width)."""

    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2


def read_conversations(path: Path) -> list[list[dict]]:
    from ..errors import RLAIFDataError

    rows = []
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            try:
                rows.append(json.loads(line)["conversations"])
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise RLAIFDataError(f"{path}:{line_number}: not a MiniMind conversation line ({exc})") from exc
    return rows


def build_tokenizer(generation: str = "minimind2"):
    """MiniMind-style tokenizer whose merges fit the bundled texts (so a prompt is ~10-20 tokens), with the
    generation's chat template and reasoning tags (MiniMind-3: `open_thinking`, `<think>`/`</think>` only)."""
    from ..models.minimind.tokenization_minimind import build_minimind_tokenizer

    from ..prompt_rendering import SYSTEM_PROMPTS

    corpus = [
        turn["content"]
        for path in (PROMPTS_FILE, FORMAT_EXAMPLES_FILE)
        for conversation in read_conversations(path)
        for turn in conversation
    ]
    if generation == "minimind3":  # its prompts may carry upstream's system prompts (system_prompt_ratio)
        corpus += SYSTEM_PROMPTS
    return build_minimind_tokenizer(corpus=corpus, generation=generation)


def build_model(vocab_size: int, spec: DemoModel = DemoModel(), generation: str = "minimind2"):
    """The demo's tiny MiniMind (`tiny_minimind_model` in `spec`'s shape, the architecture's own MLP width), its
    weights drawn from the random state the demo seeded."""
    from ..models.minimind.tiny import tiny_minimind_model

    return tiny_minimind_model(
        vocab_size,
        generation,
        seed=None,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        intermediate_size=None,
    )


def save_folder(model, tokenizer, folder: Path) -> Path:
    """`save_pretrained` model + tokenizer into `folder`, written aside and renamed into place; interrupted (a
    second Ctrl-C while the first one's save runs), the half-written `<folder>.tmp` is removed."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder


def sample_completions(model, tokenizer, training_args, prompts=SAMPLE_PROMPTS, seed: int = 0, rule_rewards=None,
                       chat_template_kwargs=None):
    """One completion per prompt, sampled as GRPO samples them, decoded as TRL decodes them, scored with the sum of
    `rule_rewards` (TRL reward functions; default the seed's `format` and `tag_count`):
    `[(prompt, completion, reward)]`."""
    from ..rewards.rule_rewards import format_reward, tag_count_reward

    texts = generate_completions(model, tokenizer, training_args, prompts, seed, chat_template_kwargs)
    terms = [reward(prompts, texts) for reward in rule_rewards or (format_reward, tag_count_reward)]
    return list(zip(prompts, texts, [sum(values) for values in zip(*terms)]))


def generate_completions(model, tokenizer, training_args, prompts, seed: int, chat_template_kwargs=None) -> list[str]:
    """One completion per prompt, sampled with GRPO's settings from `seed` and decoded as TRL decodes them; the
    prompts are rendered with the chat template and `chat_template_kwargs` (MiniMind-3: `open_thinking`)."""
    return generate_completion_ids(model, tokenizer, training_args, prompts, seed, chat_template_kwargs)[0]


def generate_completion_ids(model, tokenizer, training_args, prompts, seed: int, chat_template_kwargs=None):
    """`generate_completions`' texts and each completion's token ids as TRL hands them to reward functions
    (`completion_ids`: up to and including the first end-of-sequence token)."""
    import torch

    rendered = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True, **(chat_template_kwargs or {})
        )
        for p in prompts
    ]
    batch = tokenizer(rendered, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    model.eval()
    torch.manual_seed(seed)
    with torch.no_grad():
        output = model.generate(
            **batch,
            do_sample=True,
            temperature=training_args.temperature,
            top_k=training_args.top_k,
            top_p=training_args.top_p,
            max_new_tokens=training_args.max_completion_length,
            pad_token_id=tokenizer.pad_token_id,
        )
    generated = output[:, batch["input_ids"].shape[1] :]
    ids = []
    for row in generated.tolist():
        ended = tokenizer.eos_token_id in row
        ids.append(row[: row.index(tokenizer.eos_token_id) + 1] if ended else row)
    return tokenizer.batch_decode(generated, skip_special_tokens=True), ids
