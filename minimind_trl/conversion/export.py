"""MiniMind (Hugging Face folder or in-memory model) -> native `.pth`, Llama, Qwen3 or Qwen3-MoE.

* ``native``: the state dict upstream MiniMind loads with `load_state_dict(strict=True)` (same keys,
  both tied keys), plus a JSON sidecar of upstream `MiniMindConfig` kwargs, because a bare `.pth` does not
  record the head count, RoPE or routing settings (`minimind-trl convert --config` reads it back).
* ``llama`` (MiniMind2 dense), ``qwen3`` (MiniMind-3 dense), ``qwen3_moe`` (MiniMind-3 MoE): folders that
  transformers' own classes load strictly with the same logits, which is what vLLM, SGLang, llama.cpp and
  Ollama read. MiniMind's tensor names already are those architectures' names; only the config changes.
  Experts are written per expert (`mlp.experts.E.gate_proj.weight`), the layout of Qwen3-MoE hub
  checkpoints; transformers fuses them on load.

Not expressible, so refused: MiniMind2 MoE in any of the three (its always-on shared expert is added
unweighted, which Llama, Qwen3 and Qwen3-MoE have no place for, and Qwen3-MoE's q/k RMSNorm is not in
MiniMind2), MiniMind2 as Qwen3 (Qwen3 always applies a q/k RMSNorm MiniMind2 lacks) and MiniMind-3 as Llama
(Llama has no q/k RMSNorm). Also refused: a YaRN that transformers' `rope_type="yarn"` computes with other
frequencies than upstream MiniMind (small head_dim or low rope_theta). Training-time differences that do not
touch logits:
Qwen3-MoE's load-balancing loss averages over layers and masks padding, MiniMind-3's sums unmasked.
"""

import json
import sys
from pathlib import Path

import torch
from minimind_trl_cli.conversion import EXPORT_FORMATS, export_parser

from ..errors import ConversionError, ExportError
from ..loading_utils import (
    DTYPES,
    check_output_apart,
    check_output_folder,
    check_writable,
    loading_info_problems,
    os_error_line,
    write_folder_atomically,
)
from ..models.minimind.modeling_minimind import MiniMindForCausalLM
from ..formats.architectures import TARGET_CLASS_NAMES, transformers_config
from .export_gguf import check_gguf_output
from ..formats.export_native import check_native_outputs, export_native
from .export_source import TOKENIZER_FILES, load_minimind_folder
from ..formats.native_config import native_sidecar_path
from ..trainer.outputs.model_card import run_record
from .serving_card import model_card

VERIFY_ATOL = 1e-4  # fp32 logits of the exported model vs MiniMind; real mapping bugs are >= 1e-2
YARN_LLAMA_CPP_WARNING = (
    "warning: --format {fmt} with YaRN: transformers computes MiniMind's logits from this folder, but llama.cpp "
    "(a GGUF converted from it, Ollama) multiplies attention by its own YaRN factor 1 + 0.1*ln(factor) and will "
    "give other logits; `minimind-trl export --format gguf` refuses YaRN for that reason"
)


# --------------------------------------------------------------------------- transformers architectures


def write_portable_config(target_config, folder: Path) -> None:
    """`save_pretrained` the config, plus the key names hub checkpoints use and transformers 4.x / engines read.

    transformers 5 writes `rope_parameters`, `dtype` and (Qwen3-MoE) `num_local_experts`; real Qwen3 and
    Llama checkpoints, older transformers, vLLM and llama.cpp's converter read `rope_theta`/`rope_scaling`,
    `torch_dtype` and `num_experts`. transformers 5 loads either spelling (checked by `verify_export`).
    """
    target_config.save_pretrained(folder)
    path = folder / "config.json"
    data = json.loads(path.read_text())
    rope = data["rope_parameters"]
    data["rope_theta"] = rope["rope_theta"]
    data["rope_scaling"] = None if rope["rope_type"] == "default" else {k: v for k, v in rope.items() if k != "rope_theta"}
    data["torch_dtype"] = data["dtype"]
    if "num_local_experts" in data:
        data["num_experts"] = data.pop("num_local_experts")
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _target_class(fmt: str):
    import transformers

    return getattr(transformers, TARGET_CLASS_NAMES[fmt])


def export_hf(
    model: MiniMindForCausalLM,
    output_dir: str | Path,
    fmt: str,
    dtype: torch.dtype | None = None,
    tokenizer=None,
    force: bool = False,
    verify: bool = True,
    training: str | None = None,
) -> Path:
    """Write `model` as a `fmt` folder (config, safetensors, generation config, tokenizer, a model card naming the
    `vllm serve` flags: `serving_card`, with `training`, the training card's run section, when given), atomically.

    With `verify`, the folder is loaded with transformers' own class before it is moved into place: strict
    (no missing/unexpected/mis-shaped keys) and with fp32 logits within `VERIFY_ATOL` of MiniMind's.
    """
    from safetensors.torch import save_file

    if fmt not in ("llama", "qwen3", "qwen3_moe"):
        raise ExportError(f"unknown format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}")
    target_config = transformers_config(model.config, fmt)
    if target_config.rope_parameters["rope_type"] == "yarn":
        print(YARN_LLAMA_CPP_WARNING.format(fmt=fmt), file=sys.stderr)
    target_config.architectures = [_target_class(fmt).__name__]  # vLLM and llama.cpp's converter read it
    dtype = model.dtype if dtype is None else dtype
    target_config.dtype = dtype
    tensors = {key: value.detach().to("cpu", dtype=dtype).contiguous() for key, value in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        del tensors["lm_head.weight"]  # tied: stored once, as in hub checkpoints

    def write(folder: Path) -> None:
        write_portable_config(target_config, folder)
        model.generation_config.save_pretrained(folder)
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        card = model_card(output_dir, fmt, target_config.architectures[0], tokenizer, training)
        (folder / "README.md").write_text(card, encoding="utf-8")
        if verify:
            verify_export(model, folder, fmt, dtype)

    return write_folder_atomically(output_dir, write, force=force, error=ConversionError)


def verify_export(model: MiniMindForCausalLM, folder: str | Path, fmt: str, dtype: torch.dtype | None = None) -> float:
    """Load `folder` with transformers' class for `fmt` (strict) and compare fp32 logits; return the max difference."""
    exported, info = _target_class(fmt).from_pretrained(str(folder), dtype=torch.float32, output_loading_info=True)
    problems = loading_info_problems(info)
    if problems:
        raise ExportError(f"{folder}: transformers' {type(exported).__name__} does not load it strictly: {problems}")
    reference = model
    if dtype not in (None, torch.float32) or model.dtype != torch.float32:
        # a fresh fp32 MiniMind holding the exported (rounded) weights; `.to(fp16).float()` would also round
        # the RoPE frequency buffers, which the exported model recomputes in fp32
        reference = MiniMindForCausalLM(model.config).float()
        rounded = {k: v.to(dtype or model.dtype).float() for k, v in model.state_dict().items()}
        reference.load_state_dict(rounded, strict=True)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=generator)
    with torch.no_grad():
        expected = reference.eval()(input_ids).logits
        got = exported.eval()(input_ids).logits
    diff = (got - expected).abs().max().item()
    if not torch.isfinite(got).all() or not torch.isfinite(expected).all():
        raise ExportError(
            f"{folder}: the logits on a random probe are not finite (NaN or inf) in MiniMind or the exported "
            f"{type(exported).__name__}; the weights or the dtype overflow (try --dtype float32)"
        )
    if not diff <= VERIFY_ATOL:
        raise ExportError(
            f"{folder}: {type(exported).__name__} logits differ from MiniMind's by {diff:.3g} on a random probe "
            f"(a MoE router near-tie can do this on a real model; --no-verify skips the check)"
        )
    return diff


# --------------------------------------------------------------------------- CLI


NO_TOKENIZER_WARNING = (
    "warning: {model_dir} has no tokenizer ({files}), so {output} gets none: transformers' AutoTokenizer, vLLM, "
    "SGLang and llama.cpp's converter read it from the folder. Pass --tokenizer DIR to include one."
)


def check_output(args) -> None:
    """Fail before the model loads when the output cannot be written: it is, holds or lies inside the input (the
    model folder or --tokenizer), it exists without --force, --force would replace something this export does not
    write, or its location is not writable."""
    outputs = [args.output] + ([native_sidecar_path(args.output)] if args.fmt == "native" else [])
    for output in outputs:
        check_output_apart(output, [args.model_dir, args.tokenizer], ExportError)
    if args.fmt == "native":
        check_native_outputs(Path(args.output).absolute(), args.force)
    elif args.fmt == "gguf":
        check_gguf_output(Path(args.output).absolute(), args.force)
    else:
        check_output_folder(args.output, args.force, ExportError)
    check_output_writable(args.output, args.fmt)


def check_output_writable(output: str, fmt: str) -> None:
    """Fail before the model loads when the output location cannot be written (a replaced .pth/.gguf: its folder)."""
    path = Path(output)
    probe = path.absolute().parent if fmt in ("native", "gguf") and path.is_file() else path
    check_writable(str(probe), ExportError, "output")


def main(argv: list[str] | None = None) -> int:
    """`minimind-trl export`; user errors raise `ConversionError` (the `minimind-trl` command reports them).

    Without a tokenizer (none in the folder, no --tokenizer): gguf refuses, because the file must carry its
    vocabulary and llama.cpp/Ollama have no other place to read one; the transformers folders are still a
    correct model (a tokenizer can be copied in later), so they are written with a warning; native needs
    none (upstream MiniMind reads its tokenizer from its own model/ folder).
    """
    args = export_parser().parse_args(argv)
    if args.dtype == "q8_0" and args.fmt != "gguf":
        raise ExportError(f"--dtype q8_0 is a GGUF type; --format {args.fmt} takes {', '.join(DTYPES)} or auto")
    check_output(args)
    model, tokenizer = load_minimind_folder(args.model_dir, args.tokenizer)
    if tokenizer is None and args.fmt == "gguf":
        raise ExportError(
            f"{args.model_dir} has no tokenizer ({', '.join(TOKENIZER_FILES)}): a GGUF file carries its tokenizer and "
            f"llama.cpp/Ollama read it nowhere else. Pass --tokenizer DIR (the tokenizer the model was trained with)."
        )
    if tokenizer is None and args.fmt != "native":
        files = ", ".join(TOKENIZER_FILES)
        print(NO_TOKENIZER_WARNING.format(model_dir=args.model_dir, files=files, output=args.output), file=sys.stderr)
    try:
        return _write(args, model, tokenizer)
    except OSError as exc:  # a full disk or a vanished folder midway; nothing half-written stays behind
        raise ExportError(f"{args.output}: cannot write the export ({os_error_line(exc)})") from exc


def training_record(model_dir: str) -> str | None:
    """The run section of the training card (`README.md`) in `model_dir`, if minimind-trl trained it."""
    card = Path(model_dir) / "README.md"
    try:
        return run_record(card.read_text(encoding="utf-8")) if card.is_file() else None
    except (OSError, UnicodeDecodeError) as exc:
        raise ExportError(f"{card}: cannot be read ({type(exc).__name__}: {exc})") from exc


def _write(args, model, tokenizer) -> int:
    if args.fmt == "gguf":
        from .export_gguf import export_gguf

        dtype_name = str(model.dtype).removeprefix("torch.") if args.dtype == "auto" else args.dtype
        outtype = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "q8_0": "q8_0"}[dtype_name]
        path = export_gguf(model, args.output, tokenizer, outtype=outtype, force=args.force)
        print(f"wrote {path} ({outtype}) for llama.cpp; Ollama Modelfile: FROM {path}")
        return 0
    dtype = None if args.dtype == "auto" else DTYPES[args.dtype]
    if args.fmt == "native":
        export_native(model, args.output, dtype=dtype, force=args.force)
        sidecar = native_sidecar_path(args.output)
        print(f"wrote {args.output} (upstream MiniMind state dict) and {sidecar}")
        print(f"back to Hugging Face: minimind-trl convert {args.output} DIR --config {sidecar}")
        if tokenizer is not None:
            print(f"note: the tokenizer stays in {args.model_dir}; upstream MiniMind reads it from its model/ folder")
    else:
        training = training_record(args.model_dir)
        export_hf(
            model, args.output, args.fmt, dtype=dtype, tokenizer=tokenizer, force=args.force, verify=args.verify,
            training=training,
        )
        checked = " (checked: loads strictly, same logits)" if args.verify else ""
        print(f"wrote {args.output} as {args.fmt}{checked}")
    return 0
