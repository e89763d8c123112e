"""Reward-model scoring: one batched call against one call per conversation, equal scores.

Upstream scores every completion with `reward_model.get_score(tokenizer, messages)`, one forward pass per
conversation (two with an `<answer>`). `InternLM2Scorer.score(conversations)` sorts the conversations by
length and runs them through the model `--batch-size` at a time. This script times both routes on the same
stand-in reward model: random weights in the published InternLM2 layout (`--hidden-size 512 --layers 8` by
default, a mid-size stand-in for `internlm2-1_8b-reward`), written by `minimind_trl.models.internlm2_reward.tiny`, and
`--conversations` chat turns of mixed lengths like GRPO completions. The scores of the two routes must agree
(max abs difference printed, checked against `--atol`). The last line is one JSON object.

    python benchmarks/reward_scoring.py --threads 2
"""

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from minimind_trl.models.internlm2_reward import load_internlm2_reward_model, load_internlm2_tokenizer
from minimind_trl.models.internlm2_reward.tiny import write_tiny_internlm2_reward_model
from minimind_trl.rewards import InternLM2Scorer

WORDS = (
    "the capital of France is Paris because the river Seine flows through it and people live there "
    "think step by step then answer the question about seven days in a week and twelve months in a year "
    "天空 是 蓝色 的 因为 阳光 中 的 蓝光 被 空气 散射 得 最多"
).split()


def conversations(count: int, min_words: int, max_words: int, seed: int = 0) -> list[list[dict]]:
    """Prompts with MiniMind's default system turn plus completions of `min_words`-`max_words` words, every
    third one with a think/answer structure."""
    rng = random.Random(seed)
    out = []
    for index in range(count):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words)))
        reply = f"<think>\n{words}\n</think>\n<answer>\n{words[:60]}\n</answer>" if index % 3 == 0 else words
        out.append(
            [
                {"role": "system", "content": "You are a helpful assistant"},
                {"role": "user", "content": f"Question {index}: " + " ".join(rng.choice(WORDS) for _ in range(12))},
                {"role": "assistant", "content": reply},
            ]
        )
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--conversations", type=int, default=32)
    parser.add_argument("--min-words", type=int, default=10, help="shortest completion, in words")
    parser.add_argument("--max-words", type=int, default=60, help="longest completion, in words")
    parser.add_argument("--batch-size", type=int, default=32, help="InternLM2Scorer batch size")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--atol", type=float, default=1e-4, help="allowed |batched - one-at-a-time| per score ...")
    parser.add_argument("--rtol", type=float, default=1e-4, help="... plus this fraction of |score|")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        folder = write_tiny_internlm2_reward_model(
            Path(tmp) / "rm",
            hidden_size=args.hidden_size,
            num_hidden_layers=args.layers,
            num_attention_heads=args.heads,
            num_key_value_heads=args.kv_heads,
            intermediate_size=64 * ((int(args.hidden_size * 8 / 3) + 63) // 64),
            max_position_embeddings=4096,
        )
        model = load_internlm2_reward_model(folder, dtype=args.dtype).eval()
        tokenizer = load_internlm2_tokenizer(folder)
    chats = conversations(args.conversations, args.min_words, args.max_words)
    batched = InternLM2Scorer(model, tokenizer, batch_size=args.batch_size)
    lengths = [len(batched.token_ids(chat)) for chat in chats]

    def one_at_a_time():  # upstream: reward_model.get_score(tokenizer, messages) per conversation
        return [model.get_score(tokenizer, chat) for chat in chats]

    def all_at_once():
        return batched.score(chats)

    reference, scores = one_at_a_time(), all_at_once()  # warm-up, and the equality check
    max_diff = max(abs(a - b) for a, b in zip(reference, scores, strict=True))
    equal = all(abs(a - b) <= args.atol + args.rtol * abs(a) for a, b in zip(reference, scores, strict=True))
    times = {"one_at_a_time": [], "batched": []}
    for _ in range(args.reps):
        for name, fn in (("one_at_a_time", one_at_a_time), ("batched", all_at_once)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    single, batch = (statistics.median(times[k]) for k in ("one_at_a_time", "batched"))
    summary = {
        "hidden_size": args.hidden_size,
        "layers": args.layers,
        "conversations": args.conversations,
        "batch_size": args.batch_size,
        "min_words": args.min_words,
        "max_words": args.max_words,
        "dtype": args.dtype,
        "threads": args.threads,
        "tokens_min": min(lengths),
        "tokens_max": max(lengths),
        "tokens_mean": sum(lengths) / len(lengths),
        "one_at_a_time_s": single,
        "batched_s": batch,
        "speedup": single / batch,
        "max_abs_score_diff": max_diff,
        "score_range": [min(reference), max(reference)],
        "scores_equal": equal,
    }
    print(
        f"InternLM2-layout stand-in h{args.hidden_size} x{args.layers} ({args.dtype}), {args.conversations} "
        f"conversations of {min(lengths)}-{max(lengths)} tokens, {args.threads} threads, median of {args.reps}"
    )
    print(
        f"one at a time (get_score): {single:.3f} s   "
        f"batched (InternLM2Scorer, batch {args.batch_size}): {batch:.3f} s   speedup {single / batch:.2f}x"
    )
    print(
        f"max |score difference| {max_diff:.2e} on scores in [{min(reference):.1f}, {max(reference):.1f}] "
        f"(atol {args.atol} + rtol {args.rtol}): {'equal' if equal else 'DIFFERENT'}"
    )
    print(json.dumps(summary))
    return 0 if summary["scores_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
