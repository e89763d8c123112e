"""TRL's own multi-turn tool loop (`tools=[python functions]`) trains every turn with `MiniMindGRPOTrainer`: the
calls the model writes are parsed with MiniMind's response template, run, answered with a tool message, and the
turn after the tool's result is trained as the first is. A loss mask that cuts each row at its first EOS would
leave every turn after the first out of the loss."""

import torch
from datasets import Dataset

from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer
from minimind_trl.trainer import MiniMindGRPOTrainer

from trainer_fixtures import grpo_config, tiny_model
from grpo_fixtures import multiply

CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
ANSWER = "3 times 4 is 12."


class ScriptedTurns(MiniMindGRPOTrainer):
    """The policy samples each turn as usual (same random stream), then its text is replaced: the first turn calls
    `multiply`, the turn after the tool's result answers. Records each loss's inputs and the mask the registered
    loss trains on (`_loss_mask`, which `_registered_policy_loss` applies)."""

    recorded = []

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        super()._generate_single_turn(prompt_ids, *args, **kwargs)
        tokenizer = self.processing_class
        call, answer = (tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                        for text in (CALL, ANSWER))  # fmt: skip
        turns = [answer if "<tool_response>" in tokenizer.decode(context) else call for context in prompt_ids]
        return turns, None

    def _compute_loss(self, model, inputs):
        self.recorded.append({"inputs": inputs, "loss_mask": self._loss_mask(inputs)})
        return super()._compute_loss(model, inputs)


def test_a_trl_tool_run_trains_the_turn_after_the_tools_result(tmp_path):
    tokenizer = build_minimind_tokenizer(generation="minimind3")
    initial = tiny_model(tokenizer)
    args = grpo_config(  # the agent stage's algorithm: a registered loss, whose mask is the trainer's own
        tmp_path, max_completion_length=256, max_prompt_length=None, max_steps=1, learning_rate=1e-2,
        save_strategy="no", beta=0.0, loss_type="minimind3_cispo", advantage_estimator="group_zscore",
        epsilon_high=5.0,
    )
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "What is 3 times 4?"}]}] * 8)
    rewards = iter([[float(i % 3) for i in range(8)]])  # spread within each group, so every row has an advantage
    trainer = ScriptedTurns(
        tiny_model(tokenizer), lambda completions, **kwargs: next(rewards), args, train_dataset=dataset,
        processing_class=tokenizer, tools=[multiply],
    )  # fmt: skip
    ScriptedTurns.recorded = []
    trainer.train()

    call = tokenizer(CALL, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    answer = tokenizer(ANSWER, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    (record,) = ScriptedTurns.recorded
    inputs, loss_mask = record["inputs"], record["loss_mask"]
    for row, mask in zip(inputs["completion_ids"].tolist(), loss_mask.tolist()):
        assert row[: len(call)] == call  # the call, then the tool's result the template rendered, then the answer
        end = max(i for i, value in enumerate(mask) if value) + 1
        assert row[end - len(answer) : end] == answer, tokenizer.decode(row)
        observation = tokenizer.decode(row[len(call) : end - len(answer)])
        assert "<tool_response>" in observation and "12" in observation, observation
        # trained: both turns, every token of each up to its EOS; the tool's result is not
        assert mask[: len(call)] == [1] * len(call)
        assert mask[end - len(answer) : end] == [1] * len(answer)
        assert not any(mask[len(call) : end - len(answer)]) and not any(mask[end:])
    assert trainer.state.log_history[0]["tools/call_frequency"] > 0
    assert trainer.state.log_history[0]["tools/unanswered_by_length"] == 0.0
    moved = [not torch.equal(p, q) for p, q in zip(trainer.model.parameters(), initial.parameters())]
    assert all(moved)


def test_calls_trl_cuts_for_length_are_logged_and_warned_once(tmp_path, caplog):
    """With a max_completion_length that holds the call but not its result and an answer, TRL counts the call, drops
    the result and generates no second turn, silently: said once and logged."""
    tokenizer = build_minimind_tokenizer(generation="minimind3")
    call_length = len(tokenizer(CALL, add_special_tokens=False)["input_ids"]) + 1
    args = grpo_config(
        tmp_path, max_completion_length=call_length + 2, max_prompt_length=None, max_steps=2, learning_rate=1e-2,
        save_strategy="no", beta=0.0, loss_type="minimind3_cispo", advantage_estimator="group_zscore",
        epsilon_high=5.0,
    )
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "What is 3 times 4?"}]}] * 8)
    trainer = ScriptedTurns(
        tiny_model(tokenizer), lambda completions, **kwargs: [float(i % 3) for i in range(len(completions))], args,
        train_dataset=dataset, processing_class=tokenizer, tools=[multiply],
    )  # fmt: skip
    with caplog.at_level("WARNING", logger="minimind_trl.trainer.rollouts.tool_loop_checks"):
        trainer.train()
    logged = [entry for entry in trainer.state.log_history if "tools/unanswered_by_length" in entry]
    assert [entry["tools/unanswered_by_length"] for entry in logged] == [1.0, 1.0]
    assert caplog.text.count("TRL's tool loop left the calls of 8 of 8 completions unanswered") == 1
