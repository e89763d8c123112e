"""MiniMind-3's multi-turn agent rollout (upstream d65ef2c `train_agent.py`: `rollout_single`, `rollout_batch`) as
TRL's `rollout_func`.

Each rollout draws `open_thinking` once (`thinking_ratio`), renders its conversation with the sample's own tool
schemas, and generates up to `max_turns` turns of at most `max_completion_length` new tokens each (TRL's generation
step: the lean sampler, stock `generate` or vLLM). After a turn, every `<tool_call>` block of its text that holds JSON,
thoughts included, is answered (a well-formed call runs; anything else gets the error observation), up to the turn's
tool output cap, and the tool messages are appended as the chat template renders them; a third turn with calls marks
the rollout unfinished and ends without a generation prompt. The sampled tokens train (mask 1, EOS excepted);
the observations and template tokens do not (mask 0), as upstream masks them.

Where upstream re-renders and re-tokenizes the whole conversation at every turn and slices it by length, which
shifts the observation whenever the template rewrites a thought or BPE merges across the boundary, the sequence
here is exactly what was sampled plus the observation's own tokens (`observation_ids`), and every turn is
generated from that sequence (docs/agent.md, "Deviations").

The rollout returns TRL's `prompt_ids` / `completion_ids` / `logprobs` (the rollout engine's own log-probs of the
sampled tokens, when it has them; 0.0 on observations), `env_mask` (TRL's name for the loss mask of a custom
rollout) and, for the reward functions, `turn_outputs` (each turn's decoded text) and `unfinished`. The sequence is
cut from the left to `max_total_length` tokens as upstream's training side cuts it (`pack_rollout`).
"""

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from ..prompt_rendering import OPEN_THINKING_KWARG, check_ratio, keyed_uniform
from .data import named_schemas, prompt_messages, prompt_tools
from .parsing import tool_call_values
from .tools import Toolbox, schema_difference

logger = logging.getLogger(__name__)

MAX_TURNS = 64  # turns (model replies) per rollout: each turn regrows the context (upstream: 3)
DEFAULT_MAX_TOOL_OUTPUT = 8192  # characters of one turn's tool messages together: four full observations

# TRL's generation step: (context ids per row) -> (new ids per row, EOS included when sampled; log-probs or None)
TurnGenerator = Callable[[list[list[int]]], tuple[list[list[int]], list[list[float]] | None]]

_DUMMY_TURNS = ({"role": "user", "content": "x"}, {"role": "assistant", "content": "y"})


@dataclass
class Transcript:
    """One rollout as it grows: the first context, then sampled (mask 1) and observation (mask 0) tokens."""

    messages: list[dict]
    tools: list | None
    open_thinking: bool | None
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logps: list[float] = field(default_factory=list)
    turn_outputs: list[str] = field(default_factory=list)
    ended_with_eos: bool = False
    unfinished: bool = False
    tool_calls: int = 0
    tool_calls_unanswered: int = 0
    tool_failures: int = 0
    done: bool = False

    @property
    def context_ids(self) -> list[int]:
        """What the next turn is generated from: exactly the tokens of the sequence so far."""
        return self.prompt_ids + self.response_ids


def render_text(tokenizer, messages, *, tools, template_kwargs: Mapping, generation_prompt: bool = True) -> str:
    """The conversation rendered by the chat template."""
    return tokenizer.apply_chat_template(
        [dict(message) for message in messages], tools=tools, tokenize=False,
        add_generation_prompt=generation_prompt, **template_kwargs,
    )


def render_ids(tokenizer, messages, *, tools, template_kwargs: Mapping, generation_prompt: bool = True) -> list[int]:
    """The conversation rendered by the chat template and tokenized as upstream tokenizes it (the text, without
    added special tokens)."""
    text = render_text(tokenizer, messages, tools=tools, template_kwargs=template_kwargs,
                       generation_prompt=generation_prompt)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def observation_ids(tokenizer, contents: Sequence[str], *, template_kwargs: Mapping, generation_prompt: bool) -> list[int]:
    """The tokens the chat template puts after an assistant turn that called tools: the turn's EOS, the tool
    messages (MiniMind-3: one user turn of `<tool_response>` blocks) and, unless the rollout ends here, the next
    assistant turn's generation prompt. Rendered on a two-turn stand-in conversation (as TRL's `_get_tool_suffix_ids`
    does), so the sampled turn itself is never re-rendered; the text after the stand-in's last EOS starts at a special
    token, so it tokenizes as it would inside the whole conversation."""
    eos = tokenizer.eos_token
    tool_messages = [{"role": "tool", "content": content} for content in contents]
    prefix = tokenizer.apply_chat_template(list(_DUMMY_TURNS), tokenize=False, add_generation_prompt=False,
                                           **template_kwargs)
    full = tokenizer.apply_chat_template(list(_DUMMY_TURNS) + tool_messages, tokenize=False,
                                         add_generation_prompt=generation_prompt, **template_kwargs)
    cut = prefix.rfind(eos)
    if cut < 0 or not full.startswith(prefix[: cut + len(eos)]):
        raise ValueError("the chat template does not end an assistant turn with the EOS token before tool messages")
    suffix = full[cut + len(eos):]
    return [tokenizer.eos_token_id] + tokenizer(suffix, add_special_tokens=False)["input_ids"]


@dataclass(frozen=True)
class PackedRollout:
    """A rollout as TRL trains on it: `prompt_ids` (context only) + `completion_ids` with `env_mask` (1 = trained)
    and `logprobs` (the rollout's own, 0.0 where it has none)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]
    logprobs: list[float]


def pack_rollout(transcript: Transcript, max_total_length: int | None, eos_token_id: int) -> PackedRollout:
    """Upstream's packing: prompt + response, the last `max_total_length` tokens kept (left truncation). The first
    kept token stays context (nothing predicts it). When the last turn ended with EOS, that EOS follows, masked, so
    TRL sees which rollouts ended (its `clipped_ratio`, `mask_truncated_completions`); upstream drops it, and a
    masked last token changes no log-prob before it."""
    prompt, response = transcript.prompt_ids, transcript.response_ids
    mask, logps = transcript.response_mask, transcript.response_logps
    cut = 0
    if max_total_length is not None:
        cut = max(0, len(prompt) + len(response) - max_total_length)
    if cut < len(prompt):
        kept_prompt = prompt[cut:]
        completion, completion_mask, completion_logps = list(response), list(mask), list(logps)
    else:
        start = cut - len(prompt)  # the response is cut too: its first kept token becomes the context
        kept_prompt = response[start : start + 1]
        completion, completion_mask = response[start + 1 :], mask[start + 1 :]
        completion_logps = logps[start + 1 :]
    if transcript.ended_with_eos:
        completion, completion_mask = completion + [eos_token_id], completion_mask + [0]
        completion_logps = completion_logps + [0.0]
    if not completion and len(kept_prompt) > 1:  # nothing sampled and no EOS: TRL needs a completion token
        kept_prompt, completion, completion_mask, completion_logps = kept_prompt[:-1], kept_prompt[-1:], [0], [0.0]
    return PackedRollout(kept_prompt, completion, completion_mask, completion_logps)


class AgentRollout:
    """TRL `rollout_func` running upstream's multi-turn tool loop (see the module docstring).

    Args:
        toolbox: the tools calls run against (`minimind_trl.agent.tools`; default: upstream's six mocks); each
            sample's own schemas (its system turn's `tools`) are what the prompt shows.
        max_turns: turns (model replies) per rollout (upstream: 3, fixed).
        max_total_length: the training sequence's length cap, prompt included (upstream `--max_total_len` 2500);
            None: no cap.
        thinking_ratio: probability that a rollout opens a thought (`open_thinking=True`; upstream
            `--thinking_ratio`, default 0.1); None: the template's default. Drawn per rollout from
            (`seed`, mode, step, row), so a resumed run makes the uninterrupted run's draws.
        max_tool_output: characters one turn's tool messages may hold together (each is also cut to 2048, upstream's
            cut): the message that reaches it is cut, and the turn's later calls are not run nor answered, before the
            next generation pays for them (upstream has no such cap; its mocks answer in under 200 characters).
            None: no cap.
    """

    def __init__(
        self,
        toolbox: Toolbox | None = None,
        *,
        max_turns: int = 3,
        max_total_length: int | None = 2500,
        thinking_ratio: float | None = None,
        max_tool_output: int | None = DEFAULT_MAX_TOOL_OUTPUT,
    ):
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or not 1 <= max_turns <= MAX_TURNS:
            raise ValueError(f"agent max_turns must be an integer between 1 and {MAX_TURNS}, got {max_turns!r}")
        if max_tool_output is not None and (isinstance(max_tool_output, bool) or not isinstance(max_tool_output, int)
                                            or max_tool_output < 1):
            raise ValueError(f"agent max_tool_output must be a positive number of characters, got {max_tool_output!r}")
        if max_total_length is not None and max_total_length < 2:
            raise ValueError(f"agent max_total_length must be at least 2 tokens, got {max_total_length}")
        if thinking_ratio is not None:
            check_ratio("thinking_ratio", thinking_ratio)
        self.toolbox = Toolbox() if toolbox is None else toolbox
        self.max_turns = max_turns
        self.max_total_length = max_total_length
        self.thinking_ratio = thinking_ratio
        self.max_tool_output = max_tool_output
        self._warned_tool_output = False
        self._warned_tools: set[str] = set()
        self._calls: dict[str, tuple[int, int]] = {}  # mode -> (global step, calls made at it): keys the draws

    def __repr__(self) -> str:
        return (f"AgentRollout({self.toolbox!r}, max_turns={self.max_turns}, max_total_length={self.max_total_length}, "
                f"thinking_ratio={self.thinking_ratio}, max_tool_output={self.max_tool_output})")

    # --- TRL's entry point ---------------------------------------------------------------------------------

    def __call__(self, prompts: list, trainer) -> dict:
        tokenizer = trainer.processing_class
        template_kwargs = dict(trainer.chat_template_kwargs)
        step = self._step_key(trainer)
        first_row = trainer.accelerator.process_index * len(prompts)
        transcripts = [
            self.start(tokenizer, messages, self.draw_open_thinking(trainer.args.seed, step, first_row + i),
                       template_kwargs)
            for i, messages in enumerate(prompts)
        ]

        from ..trainer.trl_private import generate_single_turn  # not at the top: the trainer package loads TRL

        def generate(contexts):
            return generate_single_turn(trainer, contexts)  # one turn of each transcript, already one per row

        has_logprobs = self.run(transcripts, tokenizer, lockstep_generator(trainer, generate), template_kwargs)
        log_rollout_metrics(trainer, transcripts)
        return self.outputs(transcripts, tokenizer.eos_token_id, has_logprobs)

    def _step_key(self, trainer) -> str:
        """Which rollout call this is: mode, optimizer step and the count of calls in that mode at that step (dynamic
        sampling may roll out several times a step); the same after a resume."""
        mode = "train" if trainer.model.training else "eval"
        step, count = self._calls.get(mode, (-1, -1))
        count = count + 1 if step == trainer.state.global_step else 0
        self._calls[mode] = (trainer.state.global_step, count)
        return f"{mode}/{trainer.state.global_step}/{count}"

    # --- the loop (no trainer needed: tests drive it with a scripted generator) -----------------------------

    def draw_open_thinking(self, seed: int, step: str, row: int) -> bool | None:
        if self.thinking_ratio is None:
            return None
        return keyed_uniform(seed, 0, row, f"agent_open_thinking/{step}") < self.thinking_ratio

    @staticmethod
    def start(tokenizer, messages: Sequence[Mapping], open_thinking: bool | None, template_kwargs) -> Transcript:
        messages = prompt_messages(messages)
        tools = prompt_tools(messages)
        transcript = Transcript(messages, tools, open_thinking)
        transcript.prompt_ids = render_ids(tokenizer, messages, tools=tools,
                                           template_kwargs=_with_thinking(template_kwargs, open_thinking))
        return transcript

    def run(self, transcripts: list[Transcript], tokenizer, generate: TurnGenerator, template_kwargs) -> bool:
        """Every turn of every rollout: one batched generation per turn over the rollouts still going (every turn
        is visited, so processes stay in step; see `lockstep_generator`). Returns whether the generator gave
        log-probs for every sampled token. Stops once every rollout has ended (on every process, where the generation
        is collective)."""
        eos_ids = {tokenizer.eos_token_id}
        has_logprobs = True
        self.warn_unknown_tools(transcripts)
        for turn in range(self.max_turns):
            active = [t for t in transcripts if not t.done]
            if not active and not getattr(generate, "collective", False):
                break
            new_ids, new_logps = generate([t.context_ids for t in active])
            if getattr(generate, "all_ended", False):  # no process has a rollout going
                break
            has_logprobs = has_logprobs and (new_logps is not None or not active)
            for index, transcript in enumerate(active):
                logps = new_logps[index] if new_logps is not None else None
                self.take_turn(transcript, new_ids[index], logps, turn, tokenizer, eos_ids, template_kwargs)
        return has_logprobs

    def take_turn(self, transcript: Transcript, ids: list[int], logps, turn: int, tokenizer, eos_ids,
                  template_kwargs) -> None:
        """Append one sampled turn (its EOS left out: upstream never trains it) and, when it called tools, their
        observation."""
        ended = bool(ids) and ids[-1] in eos_ids
        sampled = ids[:-1] if ended else list(ids)
        transcript.response_ids += sampled
        transcript.response_mask += [1] * len(sampled)
        transcript.response_logps += list(logps[: len(sampled)]) if logps is not None else [0.0] * len(sampled)
        text = tokenizer.decode(sampled, skip_special_tokens=True)
        transcript.turn_outputs.append(text)
        transcript.ended_with_eos = ended
        calls = tool_call_values(text)  # the whole turn, thoughts included, as upstream runs them
        if not calls:
            transcript.done = True
            return
        contents, failures = self.run_calls(calls)
        transcript.tool_calls += len(calls)
        transcript.tool_calls_unanswered += len(calls) - len(contents)
        transcript.tool_failures += failures
        last = turn == self.max_turns - 1
        transcript.messages.append({"role": "assistant", "content": text})
        transcript.messages += [{"role": "tool", "content": content} for content in contents]
        observation = observation_ids(tokenizer, contents, generation_prompt=not last,
                                      template_kwargs=_with_thinking(template_kwargs, transcript.open_thinking))
        transcript.response_ids += observation
        transcript.response_mask += [0] * len(observation)
        transcript.response_logps += [0.0] * len(observation)
        transcript.ended_with_eos = False
        transcript.unfinished = last
        transcript.done = last

    def warn_unknown_tools(self, transcripts: list[Transcript]) -> None:
        """Warn once per name about a tool a prompt offers that the toolbox does not run (every call of it gets the
        error observation and counts as invalid), or offers with a schema other than the tool's own
        (`tools.schema_difference`); `minimind-trl grpo` refuses such data before training."""
        offered = [named for transcript in transcripts for named in named_schemas(transcript.tools)]
        unknown = sorted({name for name, _ in offered} - set(self.toolbox.names) - self._warned_tools)
        if unknown:
            self._warned_tools.update(unknown)
            logger.warning("agent rollout: the prompts offer %s, which the toolbox (%s) does not run: every call of "
                           "them gets the error observation and counts as invalid (warned once per tool)",
                           ", ".join(map(repr, unknown)), ", ".join(self.toolbox.names))
        for name, schema in offered:
            difference = name not in self._warned_tools and schema_difference(schema, self.toolbox.get(name).schema)
            if difference:
                self._warned_tools.add(name)
                logger.warning("agent rollout: the prompts offer %r with a schema other than the toolbox's: %s (warned "
                               "once per tool)", name, difference)

    def run_calls(self, calls: list) -> tuple[list[str], int]:
        """Run one turn's calls in order and give their tool messages and how many failed. The messages hold at most
        `max_tool_output` characters together: the one that reaches the cap is cut there, and the calls after it are
        neither run nor answered (every message holds at least one character: no empty tool message)."""
        contents, failures, left, cut = [], 0, self.max_tool_output, False
        for call in calls:
            if left is not None and left <= 0:
                break
            outcome = self.toolbox.run_call(call)
            failures += outcome.error is not None
            contents.append(outcome.observation if left is None else outcome.observation[:left])
            cut = len(contents[-1]) < len(outcome.observation)
            if left is not None:
                left -= len(contents[-1])
        unanswered = len(calls) - len(contents)
        if (cut or unanswered) and not self._warned_tool_output:
            logger.warning("agent rollout: one turn's tool messages reached agent_max_tool_output=%d characters after "
                           "%d of its %d calls: the last message is cut and the %d calls after it are not run nor "
                           "answered (agent/tool_calls_unanswered counts them; warned once)", self.max_tool_output,
                           len(contents), len(calls), unanswered)
            self._warned_tool_output = True
        return contents, failures

    def outputs(self, transcripts: list[Transcript], eos_token_id: int, has_logprobs: bool) -> dict:
        """TRL's rollout output: the packed sequences, and the fields the agent reward reads."""
        packed = [pack_rollout(t, self.max_total_length, eos_token_id) for t in transcripts]
        return {
            "prompt_ids": [p.prompt_ids for p in packed],
            "completion_ids": [p.completion_ids for p in packed],
            "logprobs": [p.logprobs for p in packed] if has_logprobs else None,
            "env_mask": [p.env_mask for p in packed],
            "turn_outputs": [t.turn_outputs for t in transcripts],
            "unfinished": [t.unfinished for t in transcripts],
        }


def _with_thinking(template_kwargs: Mapping, open_thinking: bool | None) -> dict:
    kwargs = dict(template_kwargs)
    if open_thinking is not None:
        kwargs[OPEN_THINKING_KWARG] = open_thinking
    return kwargs


def lockstep_generator(trainer, generate: TurnGenerator) -> TurnGenerator:
    """`generate`, with every process calling it the same number of times on the same number of rows where the
    generation step is collective (vLLM, ZeRO-3, FSDP): rollouts end after different numbers of turns, so a process
    with fewer active rollouts pads its batch with copies of a context (their outputs are dropped)."""
    from ..trainer.checks.weight_partitioning import weight_partitioning  # not at the top: the trainer loads TRL

    collective = trainer.accelerator.num_processes > 1 and (
        trainer.use_vllm or weight_partitioning(trainer) is not None
    )

    def step(contexts):
        if not collective:
            return generate(contexts) if contexts else ([], None)
        count = torch.tensor([len(contexts)], device=trainer.accelerator.device)
        most = int(trainer.accelerator.gather(count).max().item())
        if most == 0:
            step.all_ended = True  # every process sees it at the same turn: they all stop
            return [], None
        filler = contexts[0] if contexts else [trainer.processing_class.eos_token_id]
        ids, logps = generate(contexts + [filler] * (most - len(contexts)))
        return ids[: len(contexts)], (logps[: len(contexts)] if logps is not None else None)

    step.collective, step.all_ended = collective, False
    return step


def log_rollout_metrics(trainer, transcripts: list[Transcript]) -> None:
    """Per rollout, over every process (`agent/...` in the logs): turns, tool calls, calls left unanswered at the tool
    output cap, failed calls (not a call, an unknown tool, a tool that raised or timed out) and the unfinished
    share."""
    from ..trainer.trl_private import metrics  # not at the top: the trainer package loads TRL

    mode = "train" if trainer.model.training else "eval"
    local = torch.tensor(
        [[len(t.turn_outputs), t.tool_calls, t.tool_calls_unanswered, t.tool_failures, float(t.unfinished)]
         for t in transcripts],
        dtype=torch.float32, device=trainer.accelerator.device,
    )
    means = trainer.accelerator.gather(local).mean(dim=0).tolist()
    names = ("agent/turns", "agent/tool_calls", "agent/tool_calls_unanswered", "agent/tool_failures",
             "agent/unfinished")
    logged = metrics(trainer, mode)
    for name, value in zip(names, means, strict=True):
        logged[name].append(value)
