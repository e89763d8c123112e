"""One flag style for every `minimind-trl` command: TRL's `--snake_case`, with `--kebab-case` accepted too.

`minimind-trl grpo` parses with TRL's `TrlParser`, which already accepts both spellings of a field; the
argparse commands (`convert`, `export`, `merge-lora`, `demo`) build their parser with `FlagParser`, which
registers both spellings of every long option it is given.
"""

import argparse

DTYPE_CHOICES = ("float32", "float16", "bfloat16")  # the dtypes a command's `--dtype` takes by name


def both_spellings(option: str) -> list[str]:
    """`--num_attention_heads` -> [`--num_attention_heads`, `--num-attention-heads`] (either given)."""
    if not option.startswith("--"):
        return [option]
    name = option[2:]
    snake, kebab = "--" + name.replace("-", "_"), "--" + name.replace("_", "-")
    return [snake] if snake == kebab else [snake, kebab]


class FlagParser(argparse.ArgumentParser):
    """An `ArgumentParser` whose long options take both spellings; the snake_case one names the destination."""

    def add_argument(self, *names, **kwargs):
        spelled = [spelling for name in names for spelling in both_spellings(name)]
        return super().add_argument(*dict.fromkeys(spelled), **kwargs)


__all__ = ["DTYPE_CHOICES", "FlagParser", "both_spellings"]
