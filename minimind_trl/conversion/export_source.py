"""The folder `minimind-trl export` reads: config.json, weight files and tokenizer, checked before the weights load.

A hand-edited or truncated folder is named here (file and what is wrong) instead of failing inside transformers
with a traceback or, for an unknown model_type, an interactive trust_remote_code prompt.
"""

import json
import zipfile
from pathlib import Path

import torch

from ..errors import ConversionError, ExportError
from ..loading_utils import check_finite_weights, loading_info_problems, state_dict_problems
from ..models.minimind.configuration_minimind import MiniMindConfig
from ..models.minimind.modeling_minimind import MiniMindForCausalLM
from ..models.minimind.tokenization_minimind import portable_tokenizer

WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json"
)  # fmt: skip
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def read_minimind_config(model_dir: Path) -> MiniMindConfig:
    """`config.json`, checked to be a MiniMind config before transformers reads it: an unknown `model_type` would
    otherwise reach transformers' interactive trust_remote_code prompt, invalid JSON a generic OSError."""
    path = model_dir / "config.json"
    if not path.is_file():
        raise ExportError(
            f"{model_dir}: no config.json (expected a folder written by `minimind-trl convert` or save_pretrained)"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ExportError(f"{path}: not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ExportError(f"{path}: cannot be read ({type(exc).__name__}: {exc})") from exc
    if not isinstance(data, dict):
        raise ExportError(f"{path}: not a JSON object (a {type(data).__name__})")
    if data.get("model_type") != "minimind":
        model_type = data.get("model_type")
        raise ExportError(f"{path}: model_type is {model_type!r}, not 'minimind' (export reads MiniMind folders)")
    try:
        config = MiniMindConfig.from_pretrained(str(model_dir))
    except (ValueError, TypeError, KeyError) as exc:
        raise ExportError(f"{path}: invalid MiniMind config ({type(exc).__name__}: {exc})") from exc
    check_config_values(config, path)
    return config


def check_config_values(config: MiniMindConfig, path: Path) -> None:
    """The settings every format writes and no tensor shape checks, held to the rules `minimind-trl convert --set`
    applies: a known activation (else a KeyError inside the model), positive `rms_norm_eps` and `rope_theta`, a
    context of at least 2 tokens."""
    from ..formats.native_config import check_option_value

    values = {
        "hidden_act": config.hidden_act,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_parameters.get("rope_theta"),
        "max_position_embeddings": config.max_position_embeddings,
    }
    for key, value in values.items():
        try:
            check_option_value(key, value)
        except ConversionError as exc:
            raise ExportError(f"{path}: {exc}") from exc


def _safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor shapes from a safetensors header; safetensors refuses a file shorter than its header describes."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise ExportError(f"{path}: missing (listed in model.safetensors.index.json)")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {key: f.get_slice(key).get_shape() for key in f.keys()}
    except (SafetensorError, OSError) as exc:
        raise ExportError(f"{path} is truncated or damaged (safetensors: {exc}); copy or save it again") from exc


def check_weight_files(model_dir: Path, config: MiniMindConfig) -> None:
    """Weights present, complete and shaped as `config.json` says, from the file headers (nothing loaded): a
    copy cut short or a config edited by hand is named here instead of failing inside transformers."""
    found = next((model_dir / name for name in WEIGHT_FILES if (model_dir / name).is_file()), None)
    if found is None:
        raise ExportError(f"{model_dir / 'config.json'}: no weights (looked for {', '.join(WEIGHT_FILES)}) beside it")
    if found.name.startswith("pytorch_model"):
        files = [found] if found.suffix == ".bin" else []
        for path in files:  # a sharded .bin is checked by transformers' strict loading report below
            try:
                zipfile.ZipFile(path).close()
            except (OSError, zipfile.BadZipFile) as exc:
                raise ExportError(f"{path} is truncated or damaged ({exc}); copy or save it again") from exc
        return
    shards = ["model.safetensors"]
    if found.name.endswith(".index.json"):
        try:
            shards = sorted(set(json.loads(found.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ExportError(f"{found}: not a readable safetensors index ({type(exc).__name__}: {exc})") from exc
    shapes = {}
    for shard in shards:
        shapes.update(_safetensors_shapes(model_dir / shard))
    with torch.device("meta"):
        expected = {key: tuple(value.shape) for key, value in MiniMindForCausalLM(config).state_dict().items()}
    if config.tie_word_embeddings and "lm_head.weight" not in shapes:
        expected.pop("lm_head.weight", None)  # tied: stored once
    problems = state_dict_problems(expected, {key: torch.empty(shape, device="meta") for key, shape in shapes.items()})
    if problems:
        where = model_dir / shards[0] if len(shards) == 1 else found
        raise ExportError(f"{where}: the weights do not fit config.json: {'; '.join(problems)}")


def load_tokenizer(folder: str | Path, flag: str | None = None):
    """A tokenizer from a local folder (portable files), or an ExportError naming the folder."""
    from transformers import AutoTokenizer

    where = f"{flag} {folder}" if flag else str(folder)
    if not Path(folder).is_dir():
        raise ExportError(f"{where}: cannot load a tokenizer (no such folder)")
    try:
        return portable_tokenizer(AutoTokenizer.from_pretrained(str(folder)))
    except (OSError, ValueError, TypeError) as exc:
        raise ExportError(f"{where}: cannot load a tokenizer ({type(exc).__name__}: {exc})") from exc


def load_minimind_folder(
    model_dir: str | Path, tokenizer_dir: str | Path | None = None
) -> tuple[MiniMindForCausalLM, object | None]:
    """A MiniMind `save_pretrained` folder, loaded strictly in its saved dtype, and its tokenizer (from
    `tokenizer_dir` when given, else the folder's own if it has one). Config, weight files and tokenizer are
    checked before the weights load."""
    model_dir = Path(model_dir)
    config = read_minimind_config(model_dir)
    check_weight_files(model_dir, config)
    tokenizer = None
    if tokenizer_dir is not None:
        tokenizer = load_tokenizer(tokenizer_dir, "--tokenizer")
    elif any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        tokenizer = load_tokenizer(model_dir)
    model, info = MiniMindForCausalLM.from_pretrained(
        str(model_dir), config=config, dtype="auto", output_loading_info=True
    )
    problems = loading_info_problems(info)
    if problems:
        raise ExportError(f"{model_dir}: the weights do not match the config: {problems}")
    check_finite_weights(model.state_dict(), str(model_dir), ExportError)  # one check for every format
    return model.eval(), tokenizer


__all__ = ["TOKENIZER_FILES", "WEIGHT_FILES", "check_config_values", "check_weight_files", "load_minimind_folder",
           "load_tokenizer", "read_minimind_config"]  # fmt: skip
