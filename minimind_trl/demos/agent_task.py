"""The agent demo's task: arithmetic questions a tiny MiniMind-3 cannot answer by itself but can with
`calculate_math`, the tokenizer and warm-start transcripts for it, and how a held-out transcript is judged.

Each question ends with its expression (`计算 37+48`, `Compute 37+48`), every number from 0 to 999 is one token,
and the tool's result comes back as one token in a fixed place (`{"result": "85"}` then the template's fixed
tokens): copying the operands into the call and the result into the answer is a look-up at a fixed distance, which
a 2-layer model learns in a short SFT. Computing 37+48 itself it does not learn in minutes, so an answer without
the tool is mostly wrong.

A held-out transcript is judged with the package's own pieces, as the reward reads it: it made a valid call if one
of the calls in its answers (`parsing.answer_tool_calls`) passes the toolbox's `is_valid_call`; its answer is
correct if the final text (after the last `</tool_call>` of the last turn's answer, "" when unfinished) states the
expected result (`reward.verified_gt`) and no other number (no other run of digits).
"""

import json
import random
import re
from dataclasses import dataclass

from ..agent.mock_tools import SCHEMAS
from ..agent.parsing import TOOL_CALL_CLOSE, answer_tool_calls, split_turn
from ..agent.reward import verified_gt
from .model import DemoModel

TOOL = "calculate_math"
TOOLS = [SCHEMAS[TOOL]]
SYSTEM_PROMPT = "你是一个有用的助手。"
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")  # MiniMind-3's added tokens
LARGEST_NUMBER = 999  # every integer up to it is one token
QUESTIONS = {"zh": "计算 {}", "en": "Compute {}"}  # the expression last: a fixed distance to the call
ANSWERS = {"zh": "答案是{}。", "en": "The answer is {}."}
# The GRPO demos' shape with heads of 32 (2 query heads, 1 key/value head: the same parameter count as their 4 heads
# of 16 over 2 key/value heads): vLLM's CPU attention refuses a head size of 16, and the agent demo's model is the
# one docs/agent.md serves with `vllm serve`.
MODEL = DemoModel(num_attention_heads=2, num_key_value_heads=1)


@dataclass(frozen=True)
class Question:
    """One arithmetic question: `a op b`, its result and the language it is asked in."""

    a: int
    op: str
    b: int
    language: str

    @property
    def expression(self) -> str:
        return f"{self.a}{self.op}{self.b}"

    @property
    def result(self) -> int:
        return self.a + self.b if self.op == "+" else self.a - self.b

    def messages(self) -> list[dict]:
        """The prompt: a system turn carrying the tool's schema, the question."""
        question = QUESTIONS[self.language].format(self.expression)
        return [
            {"role": "system", "content": SYSTEM_PROMPT, "tools": json.dumps(TOOLS, ensure_ascii=False)},
            {"role": "user", "content": question},
        ]

    def row(self) -> dict:
        """The question as an `agent_rl.jsonl` line (what `minimind-trl grpo` reads)."""
        return {"conversations": self.messages() + [{"role": "assistant", "content": ""}], "gt": [str(self.result)]}

    def call_text(self) -> str:
        arguments = json.dumps({"name": TOOL, "arguments": {"expression": self.expression}})
        return f"<tool_call>\n{arguments}\n</tool_call>"

    def answer_text(self, value) -> str:
        return ANSWERS[self.language].format(value)


def make_questions(seed: int, count: int, exclude: set = frozenset()) -> list[Question]:
    """`count` distinct questions (two-digit operands, + or -, results 0..198, half in Chinese), none in
    `exclude` (compared by expression)."""
    rng = random.Random(seed)
    questions, seen = [], set(exclude)
    while len(questions) < count:
        a, b, op = rng.randint(10, 99), rng.randint(10, 99), rng.choice("+-")
        if op == "-" and a < b:
            a, b = b, a
        question = Question(a, op, b, rng.choice(("zh", "en")))
        if question.expression not in seen:
            seen.add(question.expression)
            questions.append(question)
    return questions


def build_agent_tokenizer(questions: list[Question]):
    """A MiniMind-3 tokenizer learned from the rendered task texts with their digits removed, plus every number up
    to `LARGEST_NUMBER` as a word: a number is then one token wherever it stands (`37`, ` 37`, `"37"`)."""
    from ..models.minimind.tokenization_minimind import build_minimind_tokenizer

    template = build_minimind_tokenizer(generation="minimind3")
    texts = []
    for question in questions:
        texts.append(template.apply_chat_template(question.messages(), tools=TOOLS, tokenize=False,
                                                  add_generation_prompt=True))
        texts += [question.call_text(), json.dumps({"result": ""}), question.answer_text("")]
    corpus = [re.sub(r"\d", "", text) for text in texts] + [str(n) for n in range(LARGEST_NUMBER + 1)]
    tokenizer = build_minimind_tokenizer(corpus=corpus, generation="minimind3")
    tokenizer.add_tokens(list(TOOL_TOKENS) + [system_text(template)])
    return tokenizer


def system_text(tokenizer) -> str:
    """The system turn's text as the chat template renders it (the system prompt, the `# Tools` instructions and
    the tool's schema): the same in every prompt, so the tokenizer holds it as one added token. A prompt is then ~15
    tokens instead of ~170, and the tiny model learns to copy across it in a short SFT."""
    rendered = tokenizer.apply_chat_template(Question(10, "+", 10, "en").messages(), tools=TOOLS, tokenize=False)
    start = rendered.index("system\n") + len("system\n")
    return rendered[start : rendered.index(tokenizer.eos_token, start)]


def warm_start_rows(tokenizer, questions: list[Question]) -> list[dict]:
    """TRL SFT rows (`input_ids`, `completion_mask`), two per question: one answered through the tool (call, the
    tool's observation, untrained, then the answer stating its result), one answered directly with the right
    result. Both are what a correct assistant says; GRPO has to find out which pays. Each question both ways, so
    the model learns calling as a choice it makes anew on every rollout: with one way per question it learnt which
    questions it calls on, and GRPO's groups, which repeat one question, then had no spread."""
    from ..agent.rollout import observation_ids, render_ids

    rows = []
    for question in questions:
        prompt = render_ids(tokenizer, question.messages(), tools=TOOLS, template_kwargs={})
        answer = tokenizer(question.answer_text(question.result), add_special_tokens=False)["input_ids"]
        answer.append(tokenizer.eos_token_id)
        call = tokenizer(question.call_text(), add_special_tokens=False)["input_ids"]
        observation = observation_ids(tokenizer, [json.dumps({"result": str(question.result)})], template_kwargs={},
                                      generation_prompt=True)
        # the observation's first token is the call turn's EOS: trained
        called = call + observation + answer
        called_mask = [1] * len(call) + [1] + [0] * (len(observation) - 1) + [1] * len(answer)
        for completion, mask in ((called, called_mask), (answer, [1] * len(answer))):
            rows.append({"input_ids": list(prompt) + completion, "completion_mask": [0] * len(prompt) + mask})
    return rows


@dataclass(frozen=True)
class Verdict:
    """How one held-out transcript did."""

    valid_call: bool
    correct: bool


def final_text(turn_outputs: list[str], unfinished: bool) -> str:
    """What the reward checks against `gt`: the last turn's answer after its last `</tool_call>` ("" unfinished)."""
    if unfinished or not turn_outputs:
        return ""
    return split_turn(turn_outputs[-1])[1].rpartition(TOOL_CALL_CLOSE)[2]


def judge(turn_outputs: list[str], unfinished: bool, gt: list, toolbox) -> Verdict:
    """A valid call among the answers' calls; the final text states the result and no other number."""
    valid = any(toolbox.is_valid_call(call, {TOOL}) for call in answer_tool_calls(turn_outputs))
    final = final_text(turn_outputs, unfinished)
    numbers = re.findall(r"\d+", final)  # digit runs: "85." and "是85" count (the reward's number pattern skips them)
    correct = len(verified_gt(final, gt)) == len(gt) and len(numbers) == len(gt)
    return Verdict(valid, correct)


def sample_transcripts(model, tokenizer, training_args, questions: list[Question], samples: int, seed: int,
                       toolbox, max_turns: int):
    """`samples` rollouts per question, sampled as GRPO samples them (the package's `AgentRollout` with the real
    tool, each turn from `model.generate` with the recipe's temperature, top-k, top-p and new-token limit), from
    `seed` without moving the caller's random stream: the transcripts, in question order."""
    import torch

    from ..agent.rollout import AgentRollout

    rollout = AgentRollout(toolbox, max_turns=max_turns, max_total_length=None)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id

    def generate(contexts):
        longest = max(len(context) for context in contexts)
        input_ids = torch.tensor([[pad] * (longest - len(c)) + c for c in contexts])
        attention = torch.tensor([[0] * (longest - len(c)) + [1] * len(c) for c in contexts])
        with torch.no_grad():
            output = model.generate(
                input_ids=input_ids, attention_mask=attention, do_sample=True, temperature=training_args.temperature,
                top_k=training_args.top_k, top_p=training_args.top_p, pad_token_id=pad, eos_token_id=eos,
                max_new_tokens=training_args.max_completion_length,
            )
        new = []
        for row in output[:, longest:].tolist():
            new.append(row[: row.index(eos) + 1] if eos in row else [t for t in row if t != pad])
        return new, None

    model.eval()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        transcripts = [rollout.start(tokenizer, q.messages(), None, {}) for q in questions for _ in range(samples)]
        rollout.run(transcripts, tokenizer, lambda contexts: generate(contexts) if contexts else ([], None), {})
    return transcripts


def rates(transcripts, questions: list[Question], samples: int, toolbox) -> tuple[float, float, list[Verdict]]:
    """(valid-call share, correct-answer share, each transcript's verdict)."""
    gts = [[str(q.result)] for q in questions for _ in range(samples)]
    verdicts = [judge(t.turn_outputs, t.unfinished, gt, toolbox) for t, gt in zip(transcripts, gts, strict=True)]
    count = len(verdicts)
    return sum(v.valid_call for v in verdicts) / count, sum(v.correct for v in verdicts) / count, verdicts


def solved_share(verdicts: list[Verdict]) -> float:
    """Share of transcripts that made a valid call and state its result (`judge`): what the agent reward pays most
    (3.0, against 0.5 for an answer without a call, right or wrong, or a call whose result is not stated)."""
    return sum(v.valid_call and v.correct for v in verdicts) / len(verdicts)


def copied_share(verdicts: list[Verdict]) -> float:
    """Share of the transcripts with a valid call that state its result (0.0 when none called)."""
    called = [v for v in verdicts if v.valid_call]
    return sum(v.correct for v in called) / len(called) if called else 0.0
