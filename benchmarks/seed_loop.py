"""MiniMind's GRPO step as upstream runs it, re-implemented for timing from the spec's walk-through of it.

This is the baseline `grpo_step.py` measures minimind-trl against: the same model class and weights,
upstream's control flow and costs, phase by phase:

* generation: stock `generate` on the policy *in training mode* (upstream never calls `eval()`), fp32,
  `do_sample=True, temperature=0.8, num_return_sequences=G` and transformers 4.57's implicit `top_k=50`;
* log-probs: a full `[N, R + 1, V]` logits tensor, a per-row full-vocabulary `log_softmax`, for the policy
  (with grad) and the reference model (no grad), with no attention mask (upstream passes none);
  for MoE models a *second* full policy forward only to read the aux loss;
* rewards: the rule rewards (reasoning mode) and one reward-model call per completion (two when an
  `<answer>` is present), each score clipped to [-3, 3];
* upstream's double advantage normalisation, k3 KL, loss, `backward`, grad clip, AdamW and cosine step.

It deliberately keeps upstream's inefficiencies; it is not used by the package. The only departure is
optional `min_new_tokens`, which the benchmark sets so both loops generate exactly the same lengths.
"""

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.optim.lr_scheduler import CosineAnnealingLR

FORMAT_PATTERNS = (
    r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$",
    r"^<think>\n.*?\n</think>\n\n<answer>\n.*?\n</answer>$",
)
TURN_PATTERN = r"<\|im_start\|>(system|user|assistant)\s+(.*?)<\|im_end\|>"
ANSWER_PATTERN = r"<answer>(.*?)</answer>"
REASONING_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


@dataclass
class SeedArgs:
    """Upstream's command-line defaults that matter for one step (see upstream's argument parser)."""

    num_generations: int = 8
    max_gen_len: int = 1536
    max_seq_len: int = 66  # prompt tokens kept (the last ones)
    beta: float = 0.02
    learning_rate: float = 8e-8
    grad_clip: float = 1.0
    accumulation_steps: int = 1
    reasoning: int = 1
    temperature: float = 0.8
    top_k: int = 50  # transformers' generation default when upstream was written (4.57)
    reward_clip: float = 3.0
    min_new_tokens: int | None = None  # benchmark only: force every completion to the full budget
    # On CUDA upstream trains under `torch.autocast("cuda", dtype=torch.bfloat16)` (its `--dtype bfloat16`) over fp32
    # weights; here the whole step runs under it (generation too: never slower than upstream's loop)
    autocast_dtype: torch.dtype | None = None


def seed_per_token_logps(model, input_ids: torch.Tensor, n_keep: int) -> torch.Tensor:
    """Full logits for the last `n_keep + 1` positions, then a log-softmax over the whole vocabulary per row."""
    input_ids = input_ids.detach().clone() if input_ids.is_inference() else input_ids
    logits = model(input_ids, logits_to_keep=n_keep + 1).logits[:, :-1, :]
    rows = []
    for logits_row, ids_row in zip(logits, input_ids[:, -n_keep:], strict=True):
        rows.append(torch.gather(logits_row.log_softmax(dim=-1), 1, ids_row.unsqueeze(1)).squeeze(1))
    return torch.stack(rows)


def seed_rule_rewards(responses: list[str]) -> torch.Tensor:
    """Format (+0.5 for either pattern) and tag counts (+0.25 per tag occurring exactly once)."""
    rewards = []
    for response in responses:
        matched = any(re.match(pattern, response, re.S) for pattern in FORMAT_PATTERNS)
        tags = sum(0.25 for tag in REASONING_TAGS if response.count(tag) == 1)
        rewards.append((0.5 if matched else 0.0) + tags)
    return torch.tensor(rewards)


def seed_calculate_rewards(
    prompts: list[str], responses: list[str], score_one: Callable[[list[dict]], float], args: SeedArgs
) -> torch.Tensor:
    """Upstream's `calculate_rewards`: one reward-model call per completion (two with an `<answer>`)."""
    rewards = seed_rule_rewards(responses) if args.reasoning == 1 else torch.zeros(len(responses))
    scale = args.reward_clip
    scores = []
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            messages = [
                {"role": role, "content": content.strip()}
                for role, content in re.findall(TURN_PATTERN, prompt, re.DOTALL)
            ]
            for j in range(args.num_generations):
                response = responses[i * args.num_generations + j]
                score = max(min(score_one(messages + [{"role": "assistant", "content": response}]), scale), -scale)
                if args.reasoning == 1 and (answer := re.search(ANSWER_PATTERN, response, re.DOTALL)):
                    chat = messages + [{"role": "assistant", "content": answer.group(1).strip()}]
                    answer_score = max(min(score_one(chat), scale), -scale)
                    score = score * 0.4 + answer_score * 0.6
                scores.append(score)
    return rewards + torch.tensor(scores)


def synchronized(device: torch.device) -> float:
    """The wall clock once the device's queued work is done (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class SeedGRPOLoop:
    """Holds upstream's policy, reference, optimiser and scheduler; `step(prompts)` runs one seed step.

    `score_one(messages) -> float` stands for upstream's `reward_model.get_score(reward_tokenizer, messages)`.
    """

    def __init__(self, model, ref_model, tokenizer, score_one, args: SeedArgs, total_steps: int):
        self.model, self.tokenizer, self.score_one, self.args = model, tokenizer, score_one, args
        self.ref_model = ref_model.eval().requires_grad_(False)
        self.model.train()
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
        self.scheduler = CosineAnnealingLR(
            self.optimizer, T_max=max(total_steps // args.accumulation_steps, 1), eta_min=args.learning_rate / 10
        )
        self.step_count = 0

    def step(self, prompts: list[str]) -> dict:
        """One seed step on rendered prompt strings; returns per-phase seconds and a few statistics."""
        device = next(self.model.parameters()).device
        if self.args.autocast_dtype is None or device.type == "cpu":  # upstream's autocast is a no-op on CPU
            return self._step(prompts, device)
        with torch.autocast(device.type, dtype=self.args.autocast_dtype):
            return self._step(prompts, device)

    def _step(self, prompts: list[str], device: torch.device) -> dict:
        args, tokenizer, model = self.args, self.tokenizer, self.model
        times, start, cpu_start = {}, time.perf_counter(), time.process_time()
        self.step_count += 1

        prompt_inputs = tokenizer(
            prompts,
            return_tensors="pt",
            padding=True,
            return_token_type_ids=False,
            padding_side="left",
            add_special_tokens=False,
        )
        prompt_inputs = {k: v[:, -args.max_seq_len :].to(device) for k, v in prompt_inputs.items()}

        tick, cpu_tick = synchronized(device), time.process_time()
        with torch.no_grad():
            extra = {"min_new_tokens": args.min_new_tokens} if args.min_new_tokens else {}
            outputs = model.generate(
                **prompt_inputs,
                max_new_tokens=args.max_gen_len,
                do_sample=True,
                temperature=args.temperature,
                top_k=args.top_k,
                num_return_sequences=args.num_generations,
                pad_token_id=tokenizer.pad_token_id,
                **extra,
            )
        times["generation"] = synchronized(device) - tick
        times["cpu_generation"] = time.process_time() - cpu_tick
        completion_ids = outputs[:, prompt_inputs["input_ids"].size(1) :]

        tick, cpu_tick = synchronized(device), time.process_time()
        per_token_logps = seed_per_token_logps(model, outputs, completion_ids.size(1))
        aux_loss = model(outputs).aux_loss if model.config.use_moe else torch.tensor(0.0, device=device)
        with torch.no_grad():
            ref_per_token_logps = seed_per_token_logps(self.ref_model, outputs, completion_ids.size(1))
        times["logprobs"] = synchronized(device) - tick
        times["cpu_logprobs"] = time.process_time() - cpu_tick

        tick = time.perf_counter()
        completions = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        rewards = seed_calculate_rewards(prompts, completions, self.score_one, args).to(device)
        times["reward"] = time.perf_counter() - tick

        grouped = rewards.view(-1, args.num_generations)
        mean_r = grouped.mean(dim=1).repeat_interleave(args.num_generations)
        std_r = grouped.std(dim=1).repeat_interleave(args.num_generations)
        advantages = torch.clamp((rewards - mean_r) / (std_r + 1e-4), -10, 10)
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

        is_eos = completion_ids == tokenizer.eos_token_id
        eos_idx = torch.full((is_eos.size(0),), is_eos.size(1), dtype=torch.long, device=device)
        eos_idx[is_eos.any(dim=1)] = is_eos.int().argmax(dim=1)[is_eos.any(dim=1)]
        positions = torch.arange(is_eos.size(1), device=device).expand(is_eos.size(0), -1)
        completion_mask = (positions <= eos_idx.unsqueeze(1)).int()

        kl_div = ref_per_token_logps - per_token_logps
        per_token_kl = torch.exp(kl_div) - kl_div - 1
        per_token_loss = -(
            torch.exp(per_token_logps - per_token_logps.detach()) * advantages.unsqueeze(1) - args.beta * per_token_kl
        )
        policy_loss = ((per_token_loss * completion_mask).sum(dim=1) / completion_mask.sum(dim=1)).mean()
        loss = (policy_loss + aux_loss) / args.accumulation_steps

        tick, cpu_tick = synchronized(device), time.process_time()
        loss.backward()
        if self.step_count % args.accumulation_steps == 0:
            if args.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad()
        times["backward_step"] = synchronized(device) - tick
        times["cpu_backward_step"] = time.process_time() - cpu_tick

        stats = {
            "loss": loss.item() * args.accumulation_steps,
            "aux_loss": float(aux_loss),
            "reward": rewards.mean().item(),
            "completion_length": completion_mask.sum(dim=1).float().mean().item(),
            "completion_tokens": int(completion_mask.sum()),
            "lr": self.optimizer.param_groups[0]["lr"],
        }
        times["total"] = synchronized(device) - start
        times["cpu_total"] = time.process_time() - cpu_start
        times["other"] = times["total"] - sum(times[k] for k in ("generation", "logprobs", "reward", "backward_step"))
        return {"times": times, "stats": stats}
