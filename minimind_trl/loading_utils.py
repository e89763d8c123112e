"""Loading helpers every part of the package shares: dtype names, strict state-dict checks, atomic folder writes,
whole-model loading under ZeRO-3 and `package.module:attr` imports.

They live here once so that a checkpoint is judged, and a folder written, the same way by `convert`, `export`,
`merge-lora`, the InternLM2 reward-model loader and the GRPO command.
"""

import importlib
import os
import re
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch
from minimind_trl_cli.flags import DTYPE_CHOICES

from .errors import MiniMindTRLError, OutputDirError
from .path_identity import check_output_apart  # noqa: F401  (re-exported: every command's output check)

# dtype names users write (recipes, CLI flags, config.json) -> torch dtypes
DTYPE_NAMES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}
DTYPES = {name: DTYPE_NAMES[name] for name in DTYPE_CHOICES}  # the canonical names, the commands' choices


def resolve_dtype(dtype: str | torch.dtype, error: type[Exception] = MiniMindTRLError) -> torch.dtype:
    """A torch dtype from a dtype or one of `DTYPE_NAMES`; anything else raises `error` naming the choices."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if str(dtype) not in DTYPE_NAMES:
        raise error(f"dtype must be one of {', '.join(DTYPES)} (or a torch.dtype), got {dtype!r}")
    return DTYPE_NAMES[str(dtype)]


def preview(keys, limit: int = 6) -> str:
    """The first `limit` keys and how many more: error messages name keys without printing thousands."""
    keys = list(keys)
    shown = ", ".join(str(key) for key in keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def state_dict_problems(expected, state_dict: Mapping[str, torch.Tensor]) -> list[str]:
    """Missing and unexpected keys against `expected` (key names, or a mapping of names to shapes, whose
    mis-shaped keys are reported too), as message parts; empty when everything fits."""
    missing = [key for key in expected if key not in state_dict]
    unexpected = [key for key in state_dict if key not in expected]
    shapes = expected if isinstance(expected, Mapping) else {}
    misshaped = [
        f"{key} {list(state_dict[key].shape)} (expected {list(shape)})"
        for key, shape in shapes.items()
        if key in state_dict and tuple(state_dict[key].shape) != tuple(shape)
    ]
    named = (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped))
    return [f"{kind} keys ({len(keys)}): {preview(keys)}" for kind, keys in named if keys]


def check_state_dict_matches(
    model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], what: str, error: type[Exception]
) -> None:
    """Raise `error("<what>: problem; problem")` naming every missing, unexpected and mis-shaped tensor."""
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    problems = state_dict_problems(expected, state_dict)
    if problems:
        raise error(f"{what}: " + "; ".join(problems))


def check_finite_weights(
    state_dict: Mapping[str, torch.Tensor], source: str, error: type[Exception] = MiniMindTRLError
) -> None:
    """Refuse NaN or infinite weights, naming the tensors: every format `convert` and `export` write would carry
    them (and `export`'s logits check would blame something else)."""
    not_finite = {}
    for key, value in state_dict.items():
        if value.is_floating_point() and (count := int((~torch.isfinite(value)).sum())):
            not_finite[key] = (count, value.numel())
    if not_finite:
        shown = list(not_finite.items())[:5]
        named = ", ".join(f"{key} ({count} of {numel})" for key, (count, numel) in shown)
        more = f" and {len(not_finite) - 5} more tensors" if len(not_finite) > 5 else ""
        raise error(
            f"{source}: NaN or infinite values in {named}{more}; the weights are broken (a diverged or "
            "fp16-overflowed run?): use an earlier checkpoint"
        )


def loading_info_problems(info: Mapping[str, list]) -> dict[str, list[str]]:
    """The non-empty entries of `from_pretrained(..., output_loading_info=True)`'s report."""
    return {name: sorted(map(str, keys)) for name, keys in info.items() if keys}


# What `convert`, `export` and `merge-lora` write into an output folder (save_pretrained's model, config and
# tokenizer files, the modeling code of `auto_map`, the native-policy marker, an export's model card `README.md`):
# `--force` replaces a folder holding only such files; anything else in it is the user's, and the folder is refused
# instead of deleted.
MODEL_FOLDER_FILES = re.compile(
    r"^(config\.json|generation_config\.json|(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)(\.index\.json)?|"
    r"(configuration|modeling|tokenization)_\w+\.py|tokenizer(_config)?\.json|tokenizer\.model|"
    r"special_tokens_map\.json|added_tokens\.json|vocab\.json|merges\.txt|chat_template\.(jinja|json)|"
    r"minimind_source\.json|README\.md)$"
)


def foreign_entries(folder: Path) -> list[str]:
    """The entries of an existing output folder that a model write does not produce (the user's own files)."""
    return sorted(entry.name for entry in folder.iterdir() if not MODEL_FOLDER_FILES.match(entry.name))


def check_output_folder(
    output_dir: str | Path, force: bool, error: type[Exception] = MiniMindTRLError, flag: str = "output"
) -> None:
    """An output folder that may be written: absent, empty, or (with `force`) holding only model files that this
    kind of write replaces. `force` never deletes anything else."""
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise error(f"{flag} {output_dir} exists and is not a folder")
    if not output_dir.is_dir() or not any(output_dir.iterdir()):
        return
    if not force:
        raise error(f"{flag} {output_dir} exists and is not empty (use --force to replace it)")
    _refuse_foreign(output_dir, foreign_entries(output_dir), error, flag)


def check_output_file(
    path: str | Path,
    force: bool,
    is_ours: Callable[[Path], bool],
    kind: str,
    error: type[Exception] = MiniMindTRLError,
) -> None:
    """A file output that may be written: absent, or (with `force`) a `kind` file as this command writes it
    (`is_ours`); `force` never replaces a folder or another kind of file."""
    path = Path(path)
    if not path.exists():
        return
    if path.is_dir():
        raise error(f"{path} exists and is a folder (the output here is a {kind} file)")
    if not force:
        raise error(f"{path} exists (use --force to replace a file)")
    if not is_ours(path):
        raise error(
            f"{path} exists and is not a {kind} file; --force replaces only a {kind} file: move it or pick another name"
        )


def _refuse_foreign(output_dir: Path, foreign: list[str], error, flag: str) -> None:
    if foreign:
        raise error(
            f"{flag} {output_dir} holds files this command did not write ({preview(foreign, 5)}); --force replaces "
            "only a folder of model files: move them out or pick another folder"
        )


def write_folder_atomically(
    output_dir: str | Path, write: Callable[[Path], None], force: bool = False, error: type[Exception] = MiniMindTRLError
) -> Path:
    """Run `write(tmp_dir)` in a temporary folder next to `output_dir`, then rename it into place.

    A failure leaves nothing behind (no half-written output, no new parent folders); an existing non-empty
    `output_dir` is only replaced with `force=True`, only when it holds nothing but model files (`check_output_folder`:
    the user's own files are never deleted), and only once the new folder is complete.
    """
    output_dir = Path(output_dir).absolute()
    check_output_folder(output_dir, force, error)
    created = [parent for parent in reversed(output_dir.parents) if not parent.exists()]
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.tmp-", dir=output_dir.parent))
    try:
        write(tmp_dir)
        _share_like_new_files(tmp_dir)
        if output_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.old-", dir=output_dir.parent))
            old.rmdir()
            output_dir.rename(old)
            tmp_dir.rename(output_dir)
            shutil.rmtree(old)
        else:
            tmp_dir.rename(output_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        for parent in reversed(created):
            if parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
        raise
    return output_dir


def check_writable(path: str, error: type[Exception] = OutputDirError, flag: str = "output_dir") -> None:
    """Fail now, before models load, when `path` (a folder to create or fill) cannot be written: a read-only or
    missing location, a file in the way. Probes by creating a file in the nearest existing folder."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise error(f"{flag} {path}: cannot write there ({probe} is a file, not a folder)")
    try:
        handle, name = tempfile.mkstemp(prefix=".minimind-write-check-", dir=probe)
        os.close(handle)
        os.remove(name)
    except OSError as exc:
        raise error(f"{flag} {path}: cannot write there ({exc.strerror}: {probe})") from None


def os_error_line(exc: OSError) -> str:
    """An OS error as one line naming the path (`No space left on device: out/model.safetensors`)."""
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


def _share_like_new_files(folder: Path) -> None:
    """Give the finished folder the permissions of a plainly created one (temp dirs and files are private)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


@contextmanager
def whole_model_loading():
    """Load models whole even under DeepSpeed ZeRO-3.

    With ZeRO-3, transformers' `from_pretrained` partitions every model it loads across the processes
    (`deepspeed.zero.Init`), which only works for models DeepSpeed then drives. A frozen reward model called
    directly, or a saved folder read back on one process to export it, must be loaded whole instead.
    accelerate's `zero3_init_context_manager` does not switch this off for transformers (it re-registers the
    same stage-3 config), so the registration is lifted here and restored afterwards.
    """
    from transformers.integrations import deepspeed as hf_deepspeed

    reference = hf_deepspeed._hf_deepspeed_config_weak_ref
    config = reference() if reference is not None else None
    if config is None:
        yield
        return
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed.set_hf_deepspeed_config(config)


def looks_local(name: str, file_suffixes: tuple[str, ...] = ()) -> bool:
    """A string that can only be a local path (absolute, `./`, `~`, several folders, or a file with one of
    `file_suffixes`), never a Hub id (`owner/name`): if it is missing, say so instead of asking the Hub."""
    return (
        os.path.isabs(name) or name.startswith((".", "~")) or name.count("/") > 1 or name.endswith(file_suffixes)
    )


def is_import_spec(value: str) -> bool:
    """Whether a recipe value names something to import (`package.module:function`, `package.module.function`)
    rather than a registered name: it holds a `:` or a `.`."""
    return ":" in value or "." in value


def _spec_problem(spec: str, module_name: str, attr: str) -> str | None:
    """What makes `spec` no Python import path, or None. A module is named as `import` names it (dotted Python
    names, from an importable root), never as a file or relative to one: `importlib` would raise a `TypeError`
    for `.mod` and look up `mod/x` as a module literally called so."""
    if spec.count(":") > 1:
        return "more than one ':'"
    if "/" in spec or "\\" in spec or module_name.endswith(".py") or spec.endswith(".py"):
        return "a file path, not a module name (pkg/mod.py is imported as pkg.mod)"
    if module_name.startswith("."):
        return "a relative module name (there is no package it could be relative to)"
    if not module_name or not attr:
        return "the module or the name in it is missing"
    if not all(part.isidentifier() for part in module_name.split(".")):
        return f"{module_name!r} is not a dotted Python module name"
    if not attr.isidentifier():
        return f"{attr!r} is not a Python name"
    return None


def _where_it_raised(exc: BaseException) -> str:
    """`file, line N` of the innermost frame the exception passed through, or ''."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" ({os.path.basename(frames[-1].filename)}, line {frames[-1].lineno})" if frames else ""


def _raised(exc: BaseException, doing: str) -> str:
    """One line saying how `doing` ended: a `sys.exit`, an interrupt or an exception with its message."""
    if isinstance(exc, SystemExit):
        return f"{doing} called sys.exit({exc.code!r}){_where_it_raised(exc)}"
    if isinstance(exc, KeyboardInterrupt):
        return f"{doing} was interrupted by KeyboardInterrupt{_where_it_raised(exc)}"
    message = " ".join(str(exc).split())
    return f"{doing} raised {type(exc).__name__}{_where_it_raised(exc)}{': ' + message if message else ''}"


def _same_name_elsewhere(module_name: str, missing: str | None) -> str:
    """` (did you mean 'pkg.b.mod'?)` when `module_name` itself is missing (not a module it imports) but its top
    package, already imported, holds a module of that last name elsewhere: the usual mistake after a layout change."""
    top, _, rest = module_name.partition(".")
    package = sys.modules.get(top)
    if not rest or not missing or not (module_name + ".").startswith(missing + "."):
        return ""
    leaf = module_name.rpartition(".")[2]
    found = []
    for root in getattr(package, "__path__", ()):
        for path in sorted(Path(root).rglob(f"{leaf}.py")):
            parts = (top, *path.relative_to(root).with_suffix("").parts)
            if all(part.isidentifier() for part in parts):
                found.append(".".join(parts))
    return f" (did you mean {' or '.join(repr(name) for name in found[:3])}?)" if found else ""


def import_object(spec: str, what: str, error: type[Exception] = MiniMindTRLError, form: str = "package.module:name"):
    """`package.module:name` (or `package.module.name`) -> the object. The one resolver of every name a recipe gives
    as an import path (rewards, losses, estimators, aggregations, tools, callbacks); the working directory is
    importable, as in TRL's scripts. Whatever goes wrong (a path or relative name, a module that is missing, that
    raises or calls `sys.exit` at import, a missing name) is one `error` line naming `what` (the recipe key) and
    the spec."""
    if not isinstance(spec, str):
        raise error(f"{what} {spec!r}: expected a string {form!r}")
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
    problem = _spec_problem(spec, module_name, attr)
    if problem:
        raise error(f"{what} {spec!r}: {problem}; expected {form!r}, a module importable from here")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = _same_name_elsewhere(module_name, getattr(exc, "name", None))
        raise error(f"{what} {spec!r}: cannot import module {module_name!r}: {exc}{hint}") from exc
    except MiniMindTRLError as exc:  # the module's own registration refused it (a name registered twice)
        raise error(f"{what} {spec!r}: {exc}") from exc
    except BaseException as exc:  # noqa: B036  (its sys.exit or interrupt included: the recipe's mistake, one line)
        raise error(f"{what} {spec!r}: {_raised(exc, f'importing module {module_name!r}')}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise error(f"{what} {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    except BaseException as exc:  # noqa: B036  (a module `__getattr__` that raises)
        raise error(f"{what} {spec!r}: {_raised(exc, f'looking up {attr!r} in module {module_name!r}')}") from exc


def import_function(
    spec: str, what: str, error: type[Exception] = MiniMindTRLError, form: str = "package.module:function"
):
    """`import_object` for a function a seam calls (a reward, a loss, an estimator): it must be callable."""
    func = import_object(spec, what, error, form=form)
    if not callable(func):
        raise error(f"{what} {spec!r}: the object it names is not callable (a {type(func).__name__})")
    return func


__all__ = [
    "DTYPES",
    "DTYPE_NAMES",
    "MODEL_FOLDER_FILES",
    "check_output_apart",
    "check_finite_weights",
    "check_output_file",
    "check_output_folder",
    "check_state_dict_matches",
    "check_writable",
    "import_function",
    "import_object",
    "is_import_spec",
    "looks_local",
    "loading_info_problems",
    "os_error_line",
    "preview",
    "resolve_dtype",
    "state_dict_problems",
    "whole_model_loading",
    "write_folder_atomically",
]
