"""End-to-end check of `export --format gguf` with llama.cpp itself (not part of the test suite: llama-cpp-python
compiles llama.cpp, ~25 minutes on 2 cores).

    # 1. in minimind-trl's environment: random MiniMind2 dense / MiniMind-3 dense / MiniMind-3 MoE models with
    #    MiniMind's own tokenizers, their GGUFs (f32, f16, bf16, q8_0) and transformers' fp32 logits and greedy tokens
    .venv/bin/python tests/conversion/llama_cpp_check.py make /tmp/lc
    # 2. in a separate environment: python3 -m venv /tmp/llamacpp && /tmp/llamacpp/bin/pip install llama-cpp-python numpy
    /tmp/llamacpp/bin/python tests/conversion/llama_cpp_check.py check /tmp/lc

`check` prints, per architecture, storage type and KV-cache type: whether llama.cpp tokenises the chat prompt to
the same ids, the largest logit difference over the prompt, how many of 16 greedy tokens agree, and at how many of
those 16 steps llama.cpp's argmax agrees when fed transformers' own continuation (teacher-forced). The reference
for each storage type is MiniMind (transformers, fp32 compute) holding the weights as the file stores them (f16,
bf16 or Q8_0-rounded matrices; norms and the router stay fp32), so the figures measure llama.cpp's computation.
"""

import json
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "minimind-upstream"
CASES = {
    "llama": ("MiniMind2", dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2)),
    "qwen3": ("MiniMind-3", dict(minimind_generation="minimind3", hidden_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=48)),
    "qwen3moe": ("MiniMind-3", dict(minimind_generation="minimind3", hidden_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, use_moe=True, num_experts=4,
                                    num_experts_per_tok=2, moe_intermediate_size=128)),
}  # fmt: skip
TYPES = ("f32", "f16", "bf16", "q8_0")
MESSAGES = [{"role": "user", "content": "你好，请介绍一下你自己。What is 2+3?"}]
NEW_TOKENS = 16
EOS = 2  # <|im_end|>: masked during the greedy steps, as transformers' min_new_tokens does


def make(out: Path) -> None:
    import gguf
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from minimind_trl import MiniMindConfig, MiniMindForCausalLM
    from minimind_trl.conversion.export_gguf import _tensor_for, export_gguf

    out.mkdir(parents=True, exist_ok=True)
    reference = {}
    for arch, (era, kwargs) in CASES.items():
        torch.manual_seed(0)
        model = MiniMindForCausalLM(MiniMindConfig(vocab_size=6400, **kwargs)).eval()
        with torch.no_grad():
            for param in model.parameters():
                param.normal_(0.0, param.shape[1] ** -0.5) if param.ndim == 2 else param.uniform_(0.5, 1.5)
        tokenizer = AutoTokenizer.from_pretrained(FIXTURES / era / "tokenizer")
        prompt = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(prompt)["input_ids"]
        reference[arch] = {"prompt": prompt, "ids": ids}
        for outtype in TYPES:
            export_gguf(model, out / f"{arch}-{outtype}.gguf", tokenizer, outtype=outtype, force=True)
            stored = MiniMindForCausalLM(model.config).eval()  # the weights as the file holds them, fp32 compute
            state = {}
            for key, value in model.state_dict().items():
                array, raw = _tensor_for(gguf, "ffn_gate_inp.weight" if key.endswith("mlp.gate.weight") else key,
                                         value.float(), outtype)  # fmt: skip
                array = gguf.quants.dequantize(array, raw) if raw is not None else array
                state[key] = torch.from_numpy(np.asarray(array, dtype=np.float32).reshape(value.shape))
            stored.load_state_dict(state, strict=True)
            with torch.no_grad():
                logits = stored(torch.tensor([ids])).logits[0].numpy()
                greedy = stored.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                         do_sample=False)[0, len(ids):].tolist()  # fmt: skip
            np.save(out / f"{arch}-{outtype}.logits.npy", logits)
            reference[arch][f"greedy-{outtype}"] = greedy
    (out / "reference.json").write_text(json.dumps(reference, ensure_ascii=False))


def check(out: Path) -> None:
    import llama_cpp
    import numpy as np

    reference = json.loads((out / "reference.json").read_text())
    for arch, ref in reference.items():
        for outtype in TYPES:
            expected = np.load(out / f"{arch}-{outtype}.logits.npy")
            for kv in ("f32", "f16"):
                kv_type = llama_cpp.GGML_TYPE_F32 if kv == "f32" else llama_cpp.GGML_TYPE_F16
                llm = llama_cpp.Llama(str(out / f"{arch}-{outtype}.gguf"), n_ctx=128, logits_all=True, n_threads=2,
                                      verbose=False, type_k=kv_type, type_v=kv_type)  # fmt: skip
                same_ids = llm.tokenize(ref["prompt"].encode(), add_bos=False, special=True) == ref["ids"]
                llm.eval(ref["ids"])
                diff = float(np.abs(np.array(llm.scores[: len(ref["ids"])]) - expected).max())
                greedy = []
                for _ in range(NEW_TOKENS):
                    last = np.array(llm.scores[llm.n_tokens - 1])
                    last[EOS] = -np.inf
                    greedy.append(int(np.argmax(last)))
                    llm.eval([greedy[-1]])
                expected_greedy = ref[f"greedy-{outtype}"]
                agree = sum(a == b for a, b in zip(greedy, expected_greedy))
                # teacher-forced: llama.cpp's argmax at each step given transformers' own continuation
                llm.reset()
                llm.eval(ref["ids"] + expected_greedy)
                forced = 0
                for step, token in enumerate(expected_greedy):
                    last = np.array(llm.scores[len(ref["ids"]) - 1 + step])
                    last[EOS] = -np.inf
                    forced += int(np.argmax(last)) == token
                print(f"{arch:9s} {outtype:5s} kv={kv:4s} same_ids={same_ids} max|dlogit|={diff:.2g} "
                      f"greedy={agree}/{NEW_TOKENS} teacher-forced={forced}/{NEW_TOKENS}", flush=True)  # fmt: skip
                del llm


if __name__ == "__main__":
    {"make": make, "check": check}[sys.argv[1]](Path(sys.argv[2]))
