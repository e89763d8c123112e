"""The `minimind-trl demo` runs: the default demo (reasoning format), `--agent` (tool calling), their data and tiny models.

`default` is the command's entry (`main`, `--agent` hands over to `agent`); `run` holds what every demo run does
around GRPO; `model` the bundled data, tokenizer and sampling; `variants` (with `minimind3`) which upstream GRPO the
default demo runs; `reward_model` the tiny reward model it trains; `held_out`, `progress` and `output_dir` what a
run measures, shows and writes; `agent_task` the agent demo's arithmetic task. The demos sit above `cli` (they
run its recipe -> build -> grpo stages); `cli` reaches them only by name.
"""
