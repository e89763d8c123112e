"""Whether writing an output could overwrite or delete an input, judged by file identity, not by spelling.

Two spellings name the same file when `os.stat` gives the same device and inode: a symlinked parent, a relative
path, a bind mount (`E` mounted over `D`: `E/model` is `D/model`), or another case on a case-insensitive file
system (macOS, Windows: `MODEL` is `model`). `check_output_apart` is the one check every command runs on every path
it writes (`convert`, `export`, `merge-lora`, `minimind-trl grpo`'s `output_dir`), against every input it reads.

It refuses only what would overwrite or delete an input:

* the output *is* an input (or one of the files an input folder consists of);
* the output *holds* an input: a replaced output (an export, a conversion) is deleted first, so any input inside
  it goes; a filled output (`grpo`'s `output_dir`) overwrites only the entries it writes (`writes`), so an input
  inside one of those (a policy in `checkpoint-N`, the reward model as `output_dir`) is refused and any other
  (upstream's `out/reason_512.pth` beside the run's outputs) is not;
* the output *lies inside* an input folder where it would replace one of the entries the input is read from
  (`X/config.json`); a new entry (`export X X/llama`, `X/model.gguf`) overwrites nothing and is allowed. A data
  folder is read whole (`datasets` picks files by extension), so nothing may be written inside it.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import MiniMindTRLError

# What a model, tokenizer or adapter folder is read from (config, weights, tokenizer files, modeling code).
MODEL_INPUT_FILES = re.compile(
    r"^(config\.json|generation_config\.json|(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)(\.index\.json)?|"
    r"(configuration|modeling|tokenization)_\w+\.py|tokenizer(_config)?\.json|tokenizer\.model|"
    r"special_tokens_map\.json|added_tokens\.json|vocab\.json|merges\.txt|chat_template\.(jinja|json)|"
    r"adapter_config\.json|adapter_model\.(safetensors|bin)|preprocessor_config\.json|minimind_source\.json)$"
)


@dataclass(frozen=True)
class Input:
    """A path a command reads: `flag` names it in messages; `reads` matches the entries of a folder input it is read
    from (None: the whole folder, e.g. a data folder)."""

    flag: str
    path: str | os.PathLike | None
    reads: re.Pattern | None = MODEL_INPUT_FILES


def file_id(path: str | os.PathLike) -> tuple[int, int] | None:
    """(device, inode) of what `path` names, following symlinks; None when nothing is there."""
    try:
        stat = os.stat(path)
    except (OSError, ValueError):
        return None
    return stat.st_dev, stat.st_ino


def _real(path: str | os.PathLike) -> Path:
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def position_in(path: str | os.PathLike, folder: str | os.PathLike) -> tuple[str, ...] | None:
    """The components of `path` below `folder`, comparing `folder` with each existing ancestor of `path` by identity:
    `()` when `path` is `folder`, None when it is not inside it."""
    target = file_id(folder)
    if target is None:
        return None
    current, below = _real(path), []
    while True:
        if file_id(current) == target:
            return tuple(reversed(below))
        if current.parent == current:
            return None
        below.append(current.name)
        current = current.parent


def _entry_matches(folder: Path, name: str, pattern: re.Pattern | None) -> bool:
    """Whether `folder/name` is (by identity) one of the entries of `folder` that `pattern` matches (None: any)."""
    if pattern is None:
        return True
    entry = file_id(folder / name)
    if entry is None:
        return bool(pattern.match(name))  # not there yet: the name decides
    try:
        names = os.listdir(folder)
    except OSError:
        return bool(pattern.match(name))
    return any(pattern.match(other) and file_id(folder / other) == entry for other in names)


def _is_a_read_file(output: str | os.PathLike, source: Input) -> bool:
    """Whether an existing `output` is, by identity, one of the files of the folder input `source` (a hard link or
    another spelling of `X/config.json`)."""
    out = file_id(output)
    folder = _real(source.path)
    if out is None or not folder.is_dir() or not os.path.isfile(output):
        return False
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    return any((source.reads is None or source.reads.match(name)) and file_id(folder / name) == out for name in names)


def overlap(output: str | os.PathLike, source: Input, writes: re.Pattern | None = None) -> str | None:
    """How writing `output` would overwrite or delete `source` ("is", "contains", "lies inside"), or None.
    `writes`: the entries a filled output folder writes (None: the output is replaced whole)."""
    if source.path is None or file_id(os.path.expanduser(str(source.path))) is None:
        return None  # not a local path (a Hub id), or not there: nothing to lose
    source_path = os.path.expanduser(str(source.path))
    if position_in(source_path, output) == ():
        return "is"
    if _is_a_read_file(output, source):
        return "is a file of"
    inside_output = position_in(source_path, output)
    if inside_output and (writes is None or _entry_matches(_real(output), inside_output[0], writes)):
        return "contains"
    inside_source = position_in(output, source_path)
    if inside_source and _entry_matches(_real(source_path), inside_source[0], source.reads):
        return "lies inside"
    return None


def _as_input(source) -> Input:
    return source if isinstance(source, Input) else Input("input", source)


def check_output_apart(
    output: str | os.PathLike,
    inputs,
    error: type[Exception] = MiniMindTRLError,
    flag: str = "output",
    writes: re.Pattern | None = None,
    note: str = "",
) -> None:
    """Refuse an `output` whose writing would overwrite or delete one of `inputs` (`Input`s or plain paths), by file
    identity (see the module doc); `writes` as in `overlap`. Inputs that are not local paths are skipped."""
    for source in map(_as_input, inputs):
        relation = overlap(output, source, writes)
        if relation is None:
            continue
        where = os.path.realpath(os.path.expanduser(str(output)))
        label = source.path if source.flag == "input" else f"{source.flag} {source.path}"
        raise error(
            f"{flag} {output} {relation} the input {label} ({where}): writing there would overwrite or delete "
            f"the input{note}; choose an output that neither is, holds, nor replaces a file of the input"
        )


__all__ = ["Input", "MODEL_INPUT_FILES", "check_output_apart", "file_id", "overlap", "position_in"]
