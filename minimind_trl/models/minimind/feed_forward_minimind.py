"""MiniMind's feed-forward blocks: the dense SwiGLU MLP and the MoE (experts, softmax top-k routing, load balancing).

Shipped beside ``modeling_minimind.py`` in saved folders (``save_pretrained`` copies the modules it imports
relatively), so, like it, this module imports nothing from ``minimind_trl``. ``modeling_minimind`` checks the
transformers version before importing it.

The MoE load-balancing loss is computed from per-row routing statistics (``RoutingStats``: how often each row chose
each expert and the sum of its gate probabilities), so a forward that computes a shared prompt once per group can
still count its tokens once per row, as the plain forward does (``MiniMindModel``'s ``shared_prefix_length``).
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.integrations import use_experts_implementation

from .configuration_minimind import MINIMIND2, MiniMindConfig


class SiluGatedProduct(torch.autograd.Function):
    """`silu(gate) * up`, keeping only `gate` and `up` for the backward, which recomputes `silu(gate)`: autograd
    would keep that too, one more `[tokens, intermediate]` tensor per MLP (a quarter of a dense layer's
    activations). The backward runs autograd's own operations (`grad * up`, `grad * silu(gate)`, `silu_backward`),
    so values and gradients are the same."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up = ctx.saved_tensors
        grad_gate = torch.ops.aten.silu_backward(grad * up, gate) if ctx.needs_input_grad[0] else None
        grad_up = grad * F.silu(gate) if ctx.needs_input_grad[1] else None
        return grad_gate, grad_up


class MiniMindMLP(nn.Module):
    """SwiGLU feed-forward: down(act(gate(x)) * up(x))."""

    def __init__(self, config: MiniMindConfig, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, config.hidden_size, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]
        self.silu_gated = config.hidden_act == "silu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        if self.silu_gated and torch.is_grad_enabled():  # less activation memory, same arithmetic
            return self.down_proj(SiluGatedProduct.apply(gate, up))
        return self.down_proj(self.act_fn(gate) * up)


@use_experts_implementation
class MiniMindExperts(nn.ModuleList):
    """The routed experts, one SwiGLU MLP each (upstream's parameters `experts.E.{gate,up,down}_proj.weight`), called
    the way transformers calls experts: `experts(hidden_states, top_k_index, top_k_weights)`, every token's output
    the weighted sum of its chosen experts' outputs.

    The eager forward (the default, see `MiniMindPreTrainedModel`) is upstream's loop, expert by expert. transformers'
    `batched_mm` / `grouped_mm` (`experts_implementation=...`) read the weights stacked per expert, `gate_up_proj`
    [experts, 2 * width, hidden] and `down_proj` [experts, hidden, width], built from the modules at each call; vLLM's
    transformers backend replaces the whole module with its fused MoE.
    """

    def __init__(self, config: MiniMindConfig):
        super().__init__([MiniMindMLP(config, config.moe_intermediate_size) for _ in range(config.num_experts)])
        self.num_experts = config.num_experts  # (no module attributes: the list's children must be the experts only)

    @property
    def act_fn(self) -> nn.Module:
        return self[0].act_fn

    @property
    def gate_up_proj(self) -> torch.Tensor:
        return torch.stack([torch.cat([expert.gate_proj.weight, expert.up_proj.weight]) for expert in self])

    @property
    def down_proj(self) -> torch.Tensor:
        return torch.stack([expert.down_proj.weight for expert in self])

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        output = torch.zeros_like(hidden_states)
        for expert_idx, expert in enumerate(self):
            token_idx, slot_idx = torch.where(top_k_index == expert_idx)
            expert_out = expert(hidden_states[token_idx]) * top_k_weights[token_idx, slot_idx, None]
            output.index_add_(0, token_idx, expert_out.to(output.dtype))
        return output


class MiniMindSparseMoeBlock(nn.Module):
    """Softmax-gated top-k experts, with each generation's renormalisation, shared experts and aux loss.

    MiniMind2 renormalises the top-k weights only when k > 1, adds shared experts unweighted and uses a
    per-sequence balancing loss (token-level when `seq_aux=False`); MiniMind-3 always renormalises and uses
    a token-level loss scaled by the number of experts. In the eager experts every expert runs on every call
    (possibly on zero tokens) so that data-parallel and ZeRO-3 ranks execute the same modules and all experts get
    gradients.
    """

    def __init__(self, config: MiniMindConfig):
        super().__init__()
        self.generation = config.minimind_generation
        self.top_k = config.num_experts_per_tok
        self.num_experts = config.num_experts
        self.norm_topk_prob = config.norm_topk_prob
        self.aux_loss_coef = config.router_aux_loss_coef
        self.seq_aux = config.seq_aux
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = MiniMindExperts(config)
        if config.n_shared_experts:
            self.shared_experts = nn.ModuleList(
                [MiniMindMLP(config, config.intermediate_size) for _ in range(config.n_shared_experts)]
            )

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The blended expert outputs and, in training (with a loss to train), the `routing_stats`."""
        batch_size, seq_len, hidden_dim = hidden_states.shape
        flat = hidden_states.reshape(-1, hidden_dim)
        scores = self.gate(flat).softmax(dim=-1)
        topk_weight, topk_idx = torch.topk(scores, k=self.top_k, dim=-1, sorted=False)
        if self.norm_topk_prob and (self.top_k > 1 or self.generation != MINIMIND2):
            topk_weight = topk_weight / (topk_weight.sum(dim=-1, keepdim=True) + 1e-20)

        output = self.experts(flat, topk_idx, topk_weight)
        for shared_expert in getattr(self, "shared_experts", ()):
            output = output + shared_expert(flat)
        output = output.view(batch_size, seq_len, hidden_dim)

        routing = None
        if self.training and self.aux_loss_coef > 0:
            routing = self.routing_stats(scores, topk_idx, batch_size, seq_len)
        return output, routing

    def routing_stats(self, scores, topk_idx, batch_size: int, seq_len: int) -> torch.Tensor:
        """Per row, `[batch, 2, experts]` in fp32: how many times each expert was chosen (over tokens and top-k
        slots), and the sum over the row's tokens of its gate probability. The balancing loss depends on the routing
        only through these sums, so rows' statistics can be added up before the loss is taken."""
        counts = torch.zeros(batch_size, self.num_experts, dtype=torch.float32, device=scores.device)
        chosen = topk_idx.view(batch_size, -1)
        counts.scatter_add_(1, chosen, torch.ones(chosen.shape, dtype=torch.float32, device=scores.device))
        score_sums = scores.float().view(batch_size, seq_len, self.num_experts).sum(dim=1)
        return torch.stack([counts, score_sums], dim=1)

    def load_balancing_loss(self, routing: torch.Tensor, seq_len: int) -> torch.Tensor:
        """Upstream's load-balancing loss of rows of `seq_len` tokens from their `routing_stats`: MiniMind2's
        per-sequence loss (token-level with `seq_aux=False`), MiniMind-3's token-level loss scaled by the number of
        experts."""
        counts, score_sums = routing.unbind(dim=1)
        num_experts, top_k = self.num_experts, self.top_k
        tokens = counts.shape[0] * seq_len
        if self.generation != MINIMIND2:  # the mean over top-k slots and tokens of one_hot(choice), times mean scores
            return (counts.sum(0) / tokens * (score_sums.sum(0) / tokens)).sum() * num_experts * self.aux_loss_coef
        if self.seq_aux:
            expert_load = counts / (seq_len * top_k / num_experts)
            return (expert_load * (score_sums / seq_len)).sum(dim=1).mean() * self.aux_loss_coef
        load = counts.sum(0) / (tokens * top_k)
        return (score_sums.sum(0) / tokens * load * num_experts).sum() * self.aux_loss_coef
