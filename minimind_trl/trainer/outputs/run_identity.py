"""What defines a run beyond its training settings: the starting policy (also the KL reference), the tokenizer,
the reward functions and reward models, and the training data. Recorded in every checkpoint's `minimind_run.json`
(key `run`), so a resume that changes any of them is refused instead of silently training something else.

Local models are fingerprinted cheaply: a hash of `config.json` and of each weight file's name, size and mtime
(no weights are read). A tokenizer by a hash of its vocabulary, special tokens and chat template; a `datasets`
dataset by its own fingerprint (a hash of its content and of the transforms applied, e.g. `select`).
"""

import hashlib
import json
import os

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt", ".index.json", ".gguf")


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def path_fingerprint(name_or_path: str | None) -> str | None:
    """A hash of a local model's `config.json` and its weight files' names, sizes and mtimes (or of a single
    weights file's); None for what is not a local path (a Hub id: its revision is recorded instead)."""
    if not name_or_path:
        return None
    path = os.path.expanduser(str(name_or_path))
    if os.path.isfile(path):
        stat = os.stat(path)
        return _digest([os.path.basename(path), stat.st_size, stat.st_mtime_ns])
    if not os.path.isdir(path):
        return None
    parts = []
    config = os.path.join(path, "config.json")
    if os.path.isfile(config):
        with open(config, "rb") as f:
            parts.append(["config.json", hashlib.sha256(f.read()).hexdigest()])
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name.endswith(WEIGHT_SUFFIXES) and os.path.isfile(full):
            stat = os.stat(full)
            parts.append([name, stat.st_size, stat.st_mtime_ns])
    return _digest(parts)


def tokenizer_fingerprint(tokenizer) -> str | None:
    """A hash of what tokenizes and renders the prompts: vocabulary, special tokens, chat template."""
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's text tokenizer
    if tokenizer is None or not hasattr(tokenizer, "get_vocab"):
        return None
    return _digest([sorted(tokenizer.get_vocab().items()), tokenizer.all_special_tokens, tokenizer.chat_template])


def normal_path(name_or_path):
    """A local path as its resolved absolute path (the same file however it was written); anything else as is."""
    if isinstance(name_or_path, str) and name_or_path and os.path.exists(os.path.expanduser(name_or_path)):
        return os.path.realpath(os.path.expanduser(name_or_path))
    return name_or_path


def model_source(model) -> str | None:
    """Where a policy or reward model comes from: the path or Hub id given, or a loaded model's `_name_or_path`."""
    if isinstance(model, str):
        return model
    config = getattr(model, "config", None)
    return getattr(config, "_name_or_path", None) or None


def callable_identity(func) -> str | None:
    """A function by its import name; an object by its own `repr` when its class defines one (the agent rollout
    names its tools and limits), else by its class's import name (never a memory address)."""
    if func is None:
        return None
    if hasattr(func, "__qualname__"):
        return f"{func.__module__}.{func.__qualname__}"
    if type(func).__repr__ is not object.__repr__:
        return repr(func)
    return f"{type(func).__module__}.{type(func).__qualname__}"


def dataset_identity(dataset) -> dict:
    """A dataset by its `datasets` fingerprint and row count (a dict of datasets, TRL's named eval sets, by each)."""
    if isinstance(dataset, dict):
        return {name: dataset_identity(part) for name, part in dataset.items()}
    return {"fingerprint": getattr(dataset, "_fingerprint", None),
            "rows": len(dataset) if hasattr(dataset, "__len__") else None}


def trainer_run_identity(
    model, reward_funcs, reward_func_names, processing_class, train_dataset, rollout_func=None, eval_dataset=None
) -> dict:
    """What `MiniMindGRPOTrainer` itself knows defines the run (the CLI adds the recipe's data and reward options);
    `rollout` only when a `rollout_func` makes the rollouts (the agent's: its tools and limits); `eval_dataset` only
    when the run evaluates: its held-out prompts, so that one evaluation curve is never drawn on two sets (a resume
    that starts or stops evaluating records or compares nothing here)."""
    import torch.nn as nn

    funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    reward_models = {
        name: {"name_or_path": normal_path(model_source(func)), "fingerprint": path_fingerprint(model_source(func))}
        for func, name in zip(funcs, reward_func_names)
        if isinstance(func, (str, nn.Module))
    }
    policy = model_source(model)
    return {
        "model_name_or_path": normal_path(policy),
        "model_fingerprint": path_fingerprint(policy),
        "tokenizer_fingerprint": tokenizer_fingerprint(processing_class),
        "reward_func_names": list(reward_func_names),
        "reward_models": reward_models,
        "train_dataset_fingerprint": getattr(train_dataset, "_fingerprint", None),
        "train_dataset_rows": len(train_dataset) if hasattr(train_dataset, "__len__") else None,
        **({"rollout": callable_identity(rollout_func)} if rollout_func is not None else {}),
        **({"eval_dataset": dataset_identity(eval_dataset)} if eval_dataset is not None else {}),
    }


def changed_keys(saved: dict, now: dict) -> list[str]:
    """Keys recorded by both runs whose values differ (a key only one of them records is not compared)."""
    return sorted(key for key in saved.keys() & now.keys() if saved[key] != now[key])


__all__ = [
    "callable_identity",
    "changed_keys",
    "dataset_identity",
    "model_source",
    "normal_path",
    "path_fingerprint",
    "tokenizer_fingerprint",
    "trainer_run_identity",
]
