"""The run's prompts: what `minimind-trl grpo` trains on and what it evaluates on, read as TRL's `trl grpo` reads
them and checked as the rollout needs.

As in TRL's script, the `dataset_train_split` split of `dataset_name` trains and, with an `eval_strategy` other than
`no`, its `dataset_test_split` split is the held-out set the trainer generates on and scores at every evaluation.
A mixture of TRL's `DatasetMixtureConfig` (`datasets:`, each entry's `split`, `data_files` and `fraction`,
`test_split_size`) takes `dataset_name`'s place: its `train` split trains, its `test` split (held out by
`test_split_size`) evaluates. `eval_dataset_name` (ours; TRL's script has none) names held-out prompts kept in a
source of their own. Every source goes through the rollout's own loader (`load_rlaif_dataset`, `load_agent_dataset`):
the same row checks, errors naming the file and line, for every part of every mixture. A split the source lacks is
one line naming the key that asked for it and the splits there are.

Departures from TRL's script, each refused or stated rather than silent: `dataset_streaming` and `streaming` are
refused (every row is read and checked before training, and an exact resume replays the prompt order by row index);
`test_split_size` draws its held-out rows with the run's `seed` (TRL's draw is unseeded, so a resume would train on
other rows); `datasets:` together with `dataset_name`, an entry's `name`/`data_dir` and `columns` other than the
fields the rows are read from are refused (TRL ignores `dataset_name` there, and MiniMind's rows have no
configurations and keep no other columns).
"""

import os
import re
from contextlib import contextmanager
from dataclasses import dataclass

import datasets

from ..agent.data import load_agent_dataset
from ..data import DatasetSplitError, check_split, has_one_split, load_rlaif_dataset
from ..errors import RecipeError
from ..trainer.outputs.run_identity import normal_path

DATA_FILE_SUFFIX = re.compile(r"\.(jsonl|json|parquet|csv|tsv|txt|arrow)(\.(gz|bz2|xz|zst))?$", re.IGNORECASE)

ROW_FIELDS = {"single_turn": ("conversations",), "agent": ("conversations", "gt")}  # what each loader reads of a row
MIXTURE = "the datasets mixture"
HELD_OUT_SOURCES = (
    "held-out prompts are dataset_name's dataset_test_split split (a folder with train.jsonl and test.jsonl, a Hub "
    "dataset's test split), a source of their own (eval_dataset_name) or a mixture's test_split_size"
)


@dataclass
class RunData:
    """The prompts a run trains on, and those it evaluates on (None without evaluation)."""

    train: object
    eval: object = None


@dataclass(frozen=True)
class PromptSources:
    """Where a run's prompts are read from and how: the run plan derives it from the recipe once
    (`prompt_sources`), and loading (`load_run_data`) reads it and nothing else of the recipe."""

    rollout: str = "single_turn"  # whose loader reads the rows: the agent's keeps each row's `tools` and `gt`
    roles: str = "position"  # `dataset_roles`
    dataset_name: str | None = None
    data_files: object = None  # `dataset_data_files`
    train_split: str = "train"
    test_split: str = "test"
    mixture: tuple = ()  # TRL's `datasets:` entries (`DatasetConfig`), in dataset_name's place
    test_split_size: float | None = None
    eval_dataset_name: str | None = None
    evaluates: bool = False
    max_samples: int | None = None  # `dataset_max_samples`, for the training and the held-out prompts
    seed: int = 42  # draws a mixture's held-out rows


def looks_like_hub_dataset(name: str) -> bool:
    """`owner/name` (one slash, no data-file extension, not a path form): what a Hub dataset id looks like."""
    owner, slash, repo = name.partition("/")
    return (
        bool(slash and owner and repo)
        and "/" not in repo
        and not name.startswith((".", "~"))
        and not DATA_FILE_SUFFIX.search(name)
    )


def evaluates(training_args) -> bool:
    """Whether the run evaluates during training (TRL's script builds its eval dataset exactly then)."""
    return training_args.eval_strategy != "no"


def check_dataset_source(dataset_name: str | None, dataset_config: str | None = None, key="dataset_name") -> None:
    """A local file or folder must exist; anything that is not a Hub id (`owner/name`) is taken as local,
    so a mistyped path fails here instead of as a `datasets` download error."""
    if not dataset_name:
        raise RecipeError(
            f"{key} is required (an RLAIF .jsonl file, a folder of them, or a Hub dataset; or a datasets: mixture)"
        )
    if not os.path.exists(os.path.expanduser(dataset_name)) and not looks_like_hub_dataset(dataset_name):
        kind = "data file" if DATA_FILE_SUFFIX.search(dataset_name) else "local path"
        raise RecipeError(f"{key}: {kind} {dataset_name} does not exist (and is not a Hub dataset id 'owner/name')")
    if dataset_config:
        raise RecipeError(
            f"dataset_config={dataset_config!r}: RLAIF data has no configurations; pick files with dataset_data_files"
        )


def check_data_sources(script_args, training_args) -> None:
    """Every data setting that can be judged before anything loads, refused with one line naming the key."""
    for key in ("dataset_streaming", "streaming"):
        if getattr(script_args, key):
            raise RecipeError(
                f"{key}: true is not supported: every row is read and checked before training (a bad row names its "
                "line) and an exact resume replays the prompt order by row; set it to false"
            )
    if script_args.datasets:
        check_mixture(script_args)
    else:
        check_dataset_source(script_args.dataset_name, script_args.dataset_config)
        if script_args.test_split_size is not None:
            raise RecipeError(
                f"test_split_size={script_args.test_split_size} holds out rows of a datasets: mixture; with "
                "dataset_name the held-out prompts are its dataset_test_split split (or eval_dataset_name)"
            )
    if script_args.eval_dataset_name is not None:
        if not evaluates(training_args):
            raise RecipeError(
                f"eval_dataset_name={script_args.eval_dataset_name} but eval_strategy is 'no', so nothing would "
                "evaluate on it: set eval_strategy: steps (and eval_steps) or leave eval_dataset_name unset"
            )
        if script_args.datasets and script_args.test_split_size is not None:
            raise RecipeError("eval_dataset_name and test_split_size both name held-out prompts; keep one")
        check_dataset_source(script_args.eval_dataset_name, key="eval_dataset_name")
    if script_args.datasets:
        check_mixture_splits(script_args, training_args)


def check_mixture(script_args) -> None:
    """A `datasets:` mixture whose entries MiniMind's loaders can read, and TRL's rule for `fraction`."""
    if script_args.dataset_name:
        raise RecipeError(
            f"datasets: (a mixture) and dataset_name={script_args.dataset_name} both name the training data (TRL "
            "would ignore dataset_name); keep one (dataset_name: null)"
        )
    for key in ("dataset_config", "dataset_data_files"):
        if getattr(script_args, key) is not None:
            raise RecipeError(f"{key}={getattr(script_args, key)!r} reads dataset_name, which a datasets: mixture "
                              "replaces; give each entry its own data_files")
    fields = ROW_FIELDS[script_args.rollout]
    for index, entry in enumerate(script_args.datasets):
        where = f"datasets[{index}]"
        check_dataset_source(entry.path, key=f"{where}.path")
        for key in ("name", "data_dir"):
            if getattr(entry, key) is not None:
                raise RecipeError(f"{where}.{key}={getattr(entry, key)!r}: RLAIF data has no configurations or data "
                                  "folders; pick files with data_files")
        if entry.columns is not None and sorted(entry.columns) != sorted(fields):
            raise RecipeError(
                f"{where}.columns={entry.columns}: the rows are read from {', '.join(fields)} only (the prompt, "
                "reference answer and tools come from there, no other column reaches the trainer); list exactly "
                "those or leave columns out"
            )
    fractions = [entry.fraction for entry in script_args.datasets]
    if any(fraction is not None for fraction in fractions):
        if any(fraction is None for fraction in fractions):
            raise RecipeError("datasets: fraction must be set for either all entries of the mixture or none of them")
        if any(fraction < 0 for fraction in fractions) or sum(fractions) <= 0:
            raise RecipeError(f"datasets: fractions {fractions} must be 0 or more, and not all 0")


def mixture_splits(test_split_size: float | None) -> list[str]:
    """A mixture's splits, as TRL's `get_dataset` names them: `train`, and `test` when `test_split_size` holds rows
    out."""
    return ["train"] if test_split_size is None else ["train", "test"]


def check_mixture_splits(script_args, training_args) -> None:
    """The splits the run reads of a mixture are splits it has (known before anything loads)."""
    asked = {"dataset_train_split": script_args.dataset_train_split}
    if evaluates(training_args) and script_args.eval_dataset_name is None:
        asked["dataset_test_split"] = script_args.dataset_test_split
    splits = mixture_splits(script_args.test_split_size)
    for key, split in asked.items():
        with split_named_by(key, split):
            check_split(MIXTURE, split, splits)


def mixture_part(mixture: dict, split: str | None):
    """The mixture's `split` (the plan checked it: `check_mixture_splits`), or its only split for None."""
    return mixture[split] if split is not None else next(iter(mixture.values()))


def load_prompts(sources: PromptSources, path: str, split: str | None, key: str, data_files=None):
    """The prompts of one source's split through the rollout's loader; a missing split names `key`."""
    with split_named_by(key, split):
        if sources.rollout == "agent":
            return load_agent_dataset(path, split=split, data_files=data_files)
        return load_rlaif_dataset(path, split=split, data_files=data_files, roles=sources.roles)


@contextmanager
def split_named_by(key: str, split: str | None):
    try:
        yield
    except DatasetSplitError as error:
        hint = f"; {HELD_OUT_SOURCES}" if key == "dataset_test_split" else ""
        raise RecipeError(f"{key}={split!r}: {error}{hint}") from None


def mixture_sizes(sizes: list[int], fractions: list[float]) -> list[int]:
    """Rows kept of each mixture part: TRL's `get_dataset` rule (the fractions normalised to shares, the mixture as
    large as it can be without repeating a row, the first `round(share * total)` rows of each part)."""
    weights = [fraction / sum(fractions) for fraction in fractions]
    total = min(size / weight for size, weight in zip(sizes, weights, strict=True) if weight > 0)
    return [round(weight * total) for weight in weights]


def load_mixture(sources: PromptSources) -> dict:
    """The `datasets:` mixture as TRL's `get_dataset` builds it, from MiniMind's loaders: `{"train": ...}`, and
    `"test"` when `test_split_size` holds rows out (drawn with the run's seed, so a resume holds out the same rows)."""
    parts = [
        load_prompts(sources, entry.path, entry.split, f"datasets[{index}].split", entry.data_files)
        for index, entry in enumerate(sources.mixture)
    ]
    fractions = [entry.fraction for entry in sources.mixture]
    if fractions[0] is not None:
        parts = [part.select(range(size)) for part, size in zip(parts, mixture_sizes(list(map(len, parts)), fractions))]
    rows = [row for part in parts for row in part.to_list()]
    if not rows:
        raise RecipeError(f"datasets: the mixture keeps no rows (fractions {fractions})")
    combined = datasets.Dataset.from_list(rows)  # one schema for all parts (their messages may differ in keys)
    if sources.test_split_size is None:
        return {"train": combined}
    try:
        return dict(combined.train_test_split(test_size=sources.test_split_size, seed=sources.seed))
    except ValueError as error:  # a size of no rows, or of all of them
        raise RecipeError(f"test_split_size={sources.test_split_size}: {error}") from None


def load_eval_prompts(sources: PromptSources, mixture: dict | None):
    """The held-out prompts: of `eval_dataset_name` (a file whole), of the mixture, or of `dataset_name`."""
    split = sources.test_split
    if sources.eval_dataset_name is not None:
        path = sources.eval_dataset_name
        return load_prompts(sources, path, None if has_one_split(path) else split, "dataset_test_split")
    if mixture is not None:
        return mixture_part(mixture, split)
    return load_prompts(sources, sources.dataset_name, split, "dataset_test_split", sources.data_files)


def training_source(sources: PromptSources) -> str:
    """Where the training prompts come from, as the model card names it."""
    if not sources.mixture:
        return sources.dataset_name
    parts = [f"{entry.path} [{entry.split}]" + (f" x{entry.fraction}" if entry.fraction is not None else "")
             for entry in sources.mixture]
    held_out = f", test_split_size {sources.test_split_size}" if sources.test_split_size is not None else ""
    return f"mixture of {' + '.join(parts)}{held_out}"


def held_out_source(sources: PromptSources) -> str | None:
    """Where the held-out prompts come from, as the model card names it (None without evaluation)."""
    if not sources.evaluates:
        return None
    if sources.eval_dataset_name is not None:
        return sources.eval_dataset_name
    name = MIXTURE if sources.mixture else sources.dataset_name
    return f"{name} [{sources.test_split}]"


def prompt_sources(script_args, training_args) -> PromptSources:
    """What loading the run's prompts reads of the recipe (the run plan's part)."""
    return PromptSources(
        rollout=script_args.rollout,
        roles=script_args.dataset_roles,
        dataset_name=script_args.dataset_name,
        data_files=script_args.dataset_data_files,
        train_split=script_args.dataset_train_split,
        test_split=script_args.dataset_test_split,
        mixture=tuple(script_args.datasets or ()),
        test_split_size=script_args.test_split_size,
        eval_dataset_name=script_args.eval_dataset_name,
        evaluates=evaluates(training_args),
        max_samples=script_args.dataset_max_samples,
        seed=training_args.seed,
    )


def load_run_data(sources: PromptSources) -> RunData:
    """The training prompts and, when the run evaluates, the held-out ones; `max_samples` caps both. Under several
    processes the caller has the main process read first (the others hit the cache)."""
    split = sources.train_split
    mixture = load_mixture(sources) if sources.mixture else None
    if mixture is not None:
        train = mixture_part(mixture, split)
    else:
        train = load_prompts(sources, sources.dataset_name, split, "dataset_train_split", sources.data_files)
    data = RunData(train)
    if sources.evaluates:
        data.eval = load_eval_prompts(sources, mixture)
    limit = sources.max_samples
    if limit is not None:
        data.train = data.train.select(range(min(limit, len(data.train))))
        if data.eval is not None:
            data.eval = data.eval.select(range(min(limit, len(data.eval))))
    return data


def mixture_identity(script_args) -> list[dict]:
    """The mixture's entries with their local paths resolved, for the run record (a resume must not change them)."""
    return [{**vars(entry), "path": normal_path(entry.path)} for entry in script_args.datasets or []]


__all__ = [
    "PromptSources",
    "RunData",
    "check_data_sources",
    "check_dataset_source",
    "evaluates",
    "held_out_source",
    "load_mixture",
    "load_prompts",
    "load_run_data",
    "looks_like_hub_dataset",
    "mixture_identity",
    "mixture_sizes",
    "prompt_sources",
    "training_source",
]
