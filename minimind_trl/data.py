"""MiniMind's RLAIF data as TRL prompt rows.

MiniMind's RLAIF files (`rlaif-mini.jsonl`, ...) hold one conversation per line:
`{"conversations": [{"content": ...}, {"content": ...}, ...]}`. Upstream's `RLAIFDataset` (MiniMind2,
`dataset/lm_dataset.py`) turns each line into a prompt and a reference answer:

* roles are assigned by position, user for even turns and assistant for odd ones (any `role` in the data
  is ignored);
* the last turn is the reference `answer`; the turns before it are the prompt, rendered with the policy's
  chat template and `add_generation_prompt=True`. No system turn is added by the dataset: MiniMind's
  template inserts its default one (`You are a helpful assistant`).

`load_rlaif_dataset` returns the same thing in TRL's conversational form, a `datasets.Dataset` with a
`prompt` column (the message list; TRL renders it with the policy's template, as upstream did) and an
`answer` column. Differences from upstream, on purpose:

* `roles="data"` uses the roles written in the file instead of positions (newer MiniMind data carries them);
* `system_prompt` adds an explicit system turn (upstream never does; MiniMind-3's random system prompt for 20% of
  rows and its per-prompt `open_thinking` are `minimind_trl.prompt_rendering`, applied when the trainer reads a row);
* a conversation needs at least two turns (upstream would train on a prompt with no user turn);
* bad rows are errors that name the file and line, never dropped silently (`skip_bad_rows=True` skips
  them and logs how many and where).
"""

from __future__ import annotations  # `datasets` is imported where rows are loaded: `grpo --help` needs none of it

import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import DatasetSplitError, RLAIFDataError

if TYPE_CHECKING:
    import datasets

logger = logging.getLogger(__name__)

ROLE_MODES = ("position", "data")
VALID_ROLES = ("system", "user", "assistant")


def conversation_to_row(
    conversation: Any, where: str, *, roles: str = "position", system_prompt: str | None = None
) -> dict[str, Any]:
    """One RLAIF conversation as `{"prompt": [messages], "answer": str}`; `where` names it in errors."""
    if not isinstance(conversation, list):
        raise RLAIFDataError(f"{where}: 'conversations' must be a list of turns, got {type(conversation).__name__}")
    if not conversation:
        raise RLAIFDataError(f"{where}: empty conversation")
    if len(conversation) < 2:
        raise RLAIFDataError(f"{where}: a conversation needs a prompt turn and a reference answer, got 1 turn")
    messages = []
    for index, turn in enumerate(conversation):
        if not isinstance(turn, Mapping):
            raise RLAIFDataError(f"{where}: turn {index} must be an object, got {type(turn).__name__}")
        content = turn.get("content")
        if not isinstance(content, str):
            raise RLAIFDataError(f"{where}: turn {index} has no string 'content' (got {content!r})")
        if roles == "position":
            role = "user" if index % 2 == 0 else "assistant"
        else:
            role = turn.get("role")
            if role not in VALID_ROLES:
                raise RLAIFDataError(
                    f"{where}: turn {index} has role {role!r}, expected one of {VALID_ROLES}: dataset_roles: data "
                    "(MiniMind-3's recipes set it) reads each turn's own 'role'; write one in every turn, or set "
                    "dataset_roles: position to take user, assistant, user, ... from the turns' order"
                )
        messages.append({"role": role, "content": content})
    prompt = messages[:-1]
    if system_prompt is not None:
        prompt = [{"role": "system", "content": system_prompt}] + prompt
    return {"prompt": prompt, "answer": messages[-1]["content"]}


def _looks_utf16(head: bytes) -> bool:
    """A UTF-16 byte-order mark, or ASCII text with a zero byte after (or before) every character."""
    zeros = len(head) == 4 and b"\0\0" in (head[1::2], head[::2])
    return head.startswith((b"\xff\xfe", b"\xfe\xff")) or zeros


def jsonl_records(path: Path) -> Iterator[tuple[str, Mapping | RLAIFDataError]]:
    """(location, the line's object or an exception) for each non-blank line of a JSON-lines file; an object
    without `conversations` is an error.

    Each line is decoded as UTF-8 on its own (a UTF-8 byte-order mark, which Windows editors write, is dropped),
    so a stray non-UTF-8 byte is an error naming its line (skippable like any bad row) and a UTF-16 file is
    refused as such. A file holding one JSON array is refused too: its first line would read as a broken row."""
    first = True
    with path.open("rb") as handle:
        head = handle.read(4)
        handle.seek(0)
        if _looks_utf16(head):
            raise RLAIFDataError(f"{path}: UTF-16 text; RLAIF data must be UTF-8 JSON Lines (re-save it as UTF-8)")
        for line_number, raw in enumerate(handle, start=1):
            where = f"{path}:{line_number}"
            try:
                line = raw.decode("utf-8-sig" if line_number == 1 else "utf-8")
            except UnicodeDecodeError as error:
                byte = raw[error.start : error.start + 1].hex()
                yield where, RLAIFDataError(f"{where}: not UTF-8 (byte 0x{byte} at byte {error.start + 1} of the line)")
                continue
            if not line.strip():
                continue  # blank lines hold no row
            if first and line.lstrip().startswith("["):
                raise RLAIFDataError(
                    f"{where}: a JSON array, not an object: RLAIF data must be JSON Lines, one "
                    '{"conversations": [...]} object per line (not a .json array of them)'
                )
            first = False
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                yield where, RLAIFDataError(f"{where}: malformed JSON ({error.msg} at column {error.colno})")
                continue
            except ValueError as error:  # an integer over Python's 4300-digit limit for str <-> int
                yield where, RLAIFDataError(f"{where}: a number JSON reading refuses ({error})"[:300])
                continue
            if not isinstance(record, Mapping) or "conversations" not in record:
                yield where, RLAIFDataError(f"{where}: no 'conversations' field")
                continue
            yield where, record


def dataset_records(dataset: datasets.Dataset, source: str) -> Iterator[tuple[str, Mapping | RLAIFDataError]]:
    """(location, the row or an exception) for each row of a loaded dataset; a row without `conversations` is an
    error."""
    if "conversations" not in dataset.column_names:
        raise RLAIFDataError(f"{source}: no 'conversations' column (columns: {dataset.column_names})")
    for index, record in enumerate(dataset):
        where = f"{source} row {index}"
        if record["conversations"] is None:
            yield where, RLAIFDataError(f"{where}: no 'conversations' field")
        else:
            yield where, record


FILE_SPLIT = "train"  # the one split `datasets` gives a data file (and a dataset saved without splits) has


def check_split(source: str, split: str | None, splits) -> str:
    """`split`, or the source's only split when `split` is None; a `DatasetSplitError` naming the source and the
    splits it has when it has no such split (or None is asked of several)."""
    splits = list(splits)
    if split is None and len(splits) == 1:
        return splits[0]
    if split not in splits:
        asked = f"no split {split!r}" if split is not None else "several splits"
        raise DatasetSplitError(f"{source} has {asked} (its splits: {', '.join(splits) or 'none'})")
    return split


def has_one_split(path_or_hub_name: str | os.PathLike) -> bool:
    """Whether the source is one data file or a dataset saved without splits: its rows are its only split."""
    path = Path(path_or_hub_name).expanduser()
    return path.is_file() or (path / "state.json").is_file()


def _load_with_datasets(path: Path, source: str, split, data_files, revision) -> tuple[datasets.Dataset, str]:
    """A saved dataset, a data folder or a Hub dataset, read by `datasets`; a split it lacks is a
    `DatasetSplitError` listing those it has, whatever else `datasets` raises (a missing repo, offline mode) an
    `RLAIFDataError` naming the source."""
    import datasets

    saved_without_splits = path.is_dir() and (path / "state.json").is_file()
    if saved_without_splits:
        check_split(source, split, [FILE_SPLIT])
    try:
        if saved_without_splits:
            return datasets.load_from_disk(str(path)), source
        if path.is_dir() and (path / "dataset_dict.json").is_file():
            splits = datasets.load_from_disk(str(path))
        else:
            # A local folder is read afresh: `datasets` keys its cache on the files' paths and mtimes, so a file edited
            # with its mtime restored (a copy, a checkout) would give the old rows, and the data fingerprint with them.
            fresh = datasets.DownloadMode.FORCE_REDOWNLOAD if path.is_dir() else None
            splits = datasets.load_dataset(source, data_files=data_files, revision=revision, download_mode=fresh)
    except Exception as error:  # noqa: BLE001 - datasets raises many unrelated types (ConnectionError, ...)
        raise RLAIFDataError(f"{source}: cannot load the dataset ({type(error).__name__}: {error})") from error
    split = check_split(source, split, splits)
    return splits[split], f"{source} [{split}]"


def read_records(
    path_or_hub_name: str | os.PathLike, split: str | None, data_files, revision
) -> tuple[Iterable[tuple[str, Mapping | RLAIFDataError]], str]:
    """The records of a local JSON-lines file (errors name the line) or of whatever `datasets` loads (a saved
    dataset, a data folder, a Hub dataset; errors name the row), and the source's name for messages. `split` is
    checked against the source's splits (a file has one, `FILE_SPLIT`); None reads a source's only split."""
    path = Path(path_or_hub_name).expanduser()
    source = str(path_or_hub_name)
    if path.is_file():
        check_split(source, split, [FILE_SPLIT])
        return jsonl_records(path), source
    return dataset_records(*_load_with_datasets(path, source, split, data_files, revision)), source


def collect_rows(
    records: Iterable[tuple[str, Mapping | RLAIFDataError]],
    to_row: Callable[[Mapping, str], dict],
    skip_bad_rows: bool,
    source: str,
) -> tuple[list[dict], int]:
    """`to_row(record, where)` of every record, and how many were skipped: a bad record (an `RLAIFDataError`,
    read or raised by `to_row`) stops the load unless `skip_bad_rows`, which logs how many and where."""
    rows, skipped = [], []
    for where, record in records:
        try:
            if isinstance(record, RLAIFDataError):
                raise record
            rows.append(to_row(record, where))
        except RLAIFDataError as error:
            if not skip_bad_rows:
                raise
            skipped.append(str(error))
    if skipped:
        shown = "; ".join(skipped[:5]) + ("; ..." if len(skipped) > 5 else "")
        logger.warning("%s: skipped %d bad row(s) of %d: %s", source, len(skipped), len(skipped) + len(rows), shown)
    if not rows:
        raise RLAIFDataError(f"{source}: no usable rows")
    return rows, len(skipped)


def load_rlaif_dataset(
    path_or_hub_name: str | os.PathLike,
    *,
    split: str | None = "train",
    data_files: str | list[str] | None = None,
    revision: str | None = None,
    roles: str = "position",
    system_prompt: str | None = None,
    skip_bad_rows: bool = False,
) -> datasets.Dataset:
    """Load MiniMind RLAIF conversations as a TRL dataset with `prompt` (messages) and `answer` columns.

    Args:
        path_or_hub_name: a local `.jsonl` file (read line by line, errors name the line), a folder written by
            `Dataset.save_to_disk`, a local data folder, or a Hub dataset name (both read with
            `datasets.load_dataset`; errors name the row), e.g. `"jingyaogong/minimind_dataset"` with
            `data_files="rlaif-mini.jsonl"`.
        split: the split to read: a file (or a dataset saved without splits) has one, `"train"` as `datasets`
            names it; a folder or Hub dataset has those `datasets` finds (`train.jsonl` and `test.jsonl` are two).
            None reads the source's only split.
        data_files: passed to `datasets.load_dataset` (which file(s) of a folder or Hub repo).
        revision: Hub revision.
        roles: `"position"` (upstream: user, assistant, user, ...) or `"data"` (each turn's `role` field).
        system_prompt: prepend this system turn to every prompt (default: none; the chat template's default
            system turn applies, as in upstream).
        skip_bad_rows: skip malformed rows instead of raising; the number skipped (and where) is logged as a
            warning and stored as `dataset.info.description`.

    Raises:
        RLAIFDataError: a malformed line, a row without `conversations`, an empty or one-turn conversation, a
            turn without string `content` (naming the file and line, or the row); a `.json` file holding a JSON
            array instead of JSON Lines; a source `datasets` cannot load (naming it); `DatasetSplitError`, a
            subclass, for a split the source does not have (naming those it has).
    """
    if roles not in ROLE_MODES:
        raise ValueError(f"roles must be one of {ROLE_MODES}, got {roles!r}")
    records, source = read_records(path_or_hub_name, split, data_files, revision)

    def to_row(record: Mapping, where: str) -> dict:
        return conversation_to_row(record["conversations"], where, roles=roles, system_prompt=system_prompt)

    rows, skipped = collect_rows(records, to_row, skip_bad_rows, source)
    from datasets import Dataset

    result = Dataset.from_list(rows)
    if skipped:
        result.info.description = f"{skipped} bad row(s) of {source} skipped"
    return result


__all__ = [
    "FILE_SPLIT",
    "DatasetSplitError",
    "RLAIFDataError",
    "check_split",
    "collect_rows",
    "conversation_to_row",
    "dataset_records",
    "has_one_split",
    "jsonl_records",
    "load_rlaif_dataset",
    "read_records",
]
