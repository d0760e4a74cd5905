"""A small GPT in torch, built from the same ``TransformerSpec`` the simulator reads, with
Megatron-style tensor parallelism and pipeline stages.

The model is what ``workloads.layer_ops`` counts for a GeLU, LayerNorm, learned-position,
bias-free GPT without dropout: per layer LayerNorm, a QKV projection, causal SDPA, an output
projection, a residual add, LayerNorm, fc1, GeLU, fc2, a residual add; a token and position
embedding on the first stage; a final norm, the LM head and cross-entropy on the last.

Tensor parallelism follows Shoeybi et al. 2019 (Megatron-LM, sec. 3, Fig. 3): QKV and fc1 are
column-parallel (heads and MLP columns split), the output projection and fc2 row-parallel; the
``f`` operator before a column-parallel block is the identity forward and an all-reduce
backward, the ``g`` operator after a row-parallel block an all-reduce forward and the identity
backward: two all-reduces per layer each way. The token embedding and the LM head are split
over the vocabulary: the partial embeddings are all-reduced, and Megatron's vocab-parallel
cross-entropy all-reduces the max, the sum of exponentials and the target logit.

Weights are initialised from the run's seed per parameter, as full tensors sliced to the
rank's shard, so a TP2 model computes exactly what the TP1 model computes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from clustersim.hardware_specs import SpecError
from clustersim.workloads.model import Mlp, Norm, Position, TransformerSpec

INIT_STD = 0.02
"""GPT-2's initialiser range (Radford et al. 2019, ``initializer_range`` 0.02)."""
EMBEDDING_KEY, HEAD_KEY = 1 << 20, (1 << 20) + 1
"""Seed keys of the embedding and the LM head (layers use their index)."""


def check_supported(model: TransformerSpec, path: str = "model") -> None:
    """The torch GPT implements one architecture; say which field differs from it."""
    wanted = {"mlp": (model.mlp, Mlp.GELU), "norm": (model.norm, Norm.LAYERNORM),
              "position": (model.position, Position.LEARNED), "bias": (model.bias, False),
              "dropout": (model.dropout, False), "tied_embeddings": (model.tied_embeddings, False),
              "num_experts": (model.num_experts, 1), "kv_heads": (model.kv_heads, model.heads),
              "embedding_norm": (model.embedding_norm, False)}
    for name, (have, want) in wanted.items():
        if have != want:
            shown = want.value if hasattr(want, "value") else want
            raise SpecError(f"{path}.{name}", f"the torch GPT of calibration supports only "
                            f"{shown}, got {getattr(have, 'value', have)}")
    if model.head_dim * model.heads != model.hidden:
        raise SpecError(f"{path}.head_dim", f"expected hidden/heads = {model.hidden // model.heads}")


@dataclass(frozen=True, slots=True)
class TensorGroup:
    """This rank's tensor-parallel group (size 1: no tensor parallelism)."""

    group: object = None
    size: int = 1
    rank: int = 0


class _CopyToTensorParallel(torch.autograd.Function):
    """Megatron's ``f``: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits split by vocabulary (Megatron-LM
    ``core/tensor_parallel/cross_entropy.py``): three all-reduces of one value per token."""

    @staticmethod
    def forward(ctx, logits, target, group, vocab_start):
        logits = logits.float()
        local_max = logits.max(dim=-1).values
        dist.all_reduce(local_max, op=dist.ReduceOp.MAX, group=group)
        logits = logits - local_max.unsqueeze(-1)
        vocab_end = vocab_start + logits.shape[-1]
        outside = (target < vocab_start) | (target >= vocab_end)
        local_target = (target - vocab_start).masked_fill(outside, 0)
        rows = torch.arange(logits.shape[0], device=logits.device)
        predicted = logits[rows, local_target].masked_fill(outside, 0.0)
        dist.all_reduce(predicted, group=group)
        exp = logits.exp()
        sum_exp = exp.sum(dim=-1)
        dist.all_reduce(sum_exp, group=group)
        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), outside, local_target)
        return (sum_exp.log() - predicted).mean()

    @staticmethod
    def backward(ctx, grad):
        softmax, outside, local_target = ctx.saved_tensors
        rows = torch.arange(softmax.shape[0], device=softmax.device)
        softmax[rows, local_target] -= (~outside).to(softmax.dtype)
        return softmax.mul_(grad / softmax.shape[0]), None, None, None


class ParameterSource:
    """Full initial tensors drawn per parameter from the run's seed (numpy SeedSequence), so
    every rank, whatever its shard or stage, derives the same model."""

    def __init__(self, seed: int):
        self.seed = seed

    def normal(self, key: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
        state = np.random.SeedSequence((self.seed,) + key).generate_state(2, dtype=np.uint64)
        g = torch.Generator().manual_seed(int(state[0] >> np.uint64(1)))
        return torch.randn(shape, generator=g) * INIT_STD


def _parameter(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.contiguous().clone())


class Layer(nn.Module):
    """One transformer layer's share on this rank (heads and MLP columns split over TP)."""

    def __init__(self, model: TransformerSpec, index: int, tp: TensorGroup, source: ParameterSource):
        super().__init__()
        h, heads, d = model.hidden, model.heads, model.head_dim
        if heads % tp.size or model.ffn_hidden % tp.size:
            raise SpecError("strategy.tp", f"{tp.size} does not divide heads={heads} and "
                            f"ffn_hidden={model.ffn_hidden}")
        self.tp = tp
        self.local_heads, self.head_dim = heads // tp.size, d
        hs = slice(tp.rank * self.local_heads, (tp.rank + 1) * self.local_heads)
        fs = slice(tp.rank * model.ffn_hidden // tp.size, (tp.rank + 1) * model.ffn_hidden // tp.size)
        key = (index,)
        qkv = source.normal(key + (0,), (3, heads, d, h))[:, hs].reshape(-1, h)
        proj = source.normal(key + (1,), (h, heads, d))[:, hs].reshape(h, -1)
        fc1 = source.normal(key + (2,), (model.ffn_hidden, h))[fs]
        fc2 = source.normal(key + (3,), (h, model.ffn_hidden))[:, fs]
        self.norm1 = nn.LayerNorm(h, bias=False)
        self.norm2 = nn.LayerNorm(h, bias=False)
        self.qkv, self.proj = _parameter(qkv), _parameter(proj)
        self.fc1, self.fc2 = _parameter(fc1), _parameter(fc2)

    def _enter(self, x: torch.Tensor) -> torch.Tensor:
        return _CopyToTensorParallel.apply(x, self.tp.group) if self.tp.size > 1 else x

    def _leave(self, x: torch.Tensor) -> torch.Tensor:
        return _ReduceFromTensorParallel.apply(x, self.tp.group) if self.tp.size > 1 else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = F.linear(self._enter(self.norm1(x)), self.qkv)
        q, k, v = qkv.view(b, s, 3, self.local_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        a = a.transpose(1, 2).reshape(b, s, self.local_heads * self.head_dim)
        x = x + self._leave(F.linear(a, self.proj))
        y = F.gelu(F.linear(self._enter(self.norm2(x)), self.fc1))
        return x + self._leave(F.linear(y, self.fc2))


class Embedding(nn.Module):
    """Vocab-parallel token embedding (Megatron-LM ``VocabParallelEmbedding``: each TP rank
    looks up its slice of the vocabulary, zeros for tokens outside it, and the partial
    embeddings are all-reduced) plus learned positions, replicated over TP."""

    def __init__(self, model: TransformerSpec, seq_len: int, tp: TensorGroup,
                 source: ParameterSource):
        super().__init__()
        if model.vocab % tp.size:
            raise SpecError("strategy.tp", f"{tp.size} does not divide model.vocab={model.vocab}")
        local = model.vocab // tp.size
        self.tp, self.vocab_start = tp, tp.rank * local
        self.tokens = _parameter(source.normal((EMBEDDING_KEY, 0), (model.vocab, model.hidden))
                                 [self.vocab_start:self.vocab_start + local])
        self.positions = _parameter(source.normal((EMBEDDING_KEY, 1), (seq_len, model.hidden)))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            x = F.embedding(tokens, self.tokens)
        else:
            local = tokens - self.vocab_start
            outside = (local < 0) | (local >= self.tokens.shape[0])
            x = F.embedding(local.masked_fill(outside, 0), self.tokens)
            x = _ReduceFromTensorParallel.apply(x.masked_fill(outside.unsqueeze(-1), 0.0),
                                                self.tp.group)
        return x + self.positions[: tokens.shape[1]]


class Head(nn.Module):
    """Final norm, LM head split over the vocabulary, cross-entropy (mean over tokens)."""

    def __init__(self, model: TransformerSpec, tp: TensorGroup, source: ParameterSource):
        super().__init__()
        if model.vocab % tp.size:
            raise SpecError("strategy.tp", f"{tp.size} does not divide model.vocab={model.vocab}")
        local = model.vocab // tp.size
        self.tp, self.vocab_start = tp, tp.rank * local
        self.norm = nn.LayerNorm(model.hidden, bias=False)
        self.weight = _parameter(source.normal((HEAD_KEY, 0), (model.vocab, model.hidden))
                                 [self.vocab_start:self.vocab_start + local])

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        if self.tp.size == 1:
            logits = F.linear(x, self.weight)
            return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        logits = F.linear(_CopyToTensorParallel.apply(x, self.tp.group), self.weight)
        return _VocabParallelCrossEntropy.apply(logits.flatten(0, 1), targets.flatten(),
                                                self.tp.group, self.vocab_start)


class Stage(nn.Module):
    """The layers of one pipeline stage, with the embedding on the first and the head on the
    last; ``forward`` takes tokens or the previous stage's activation and returns the loss
    (last stage) or the activation to send on."""

    def __init__(self, model: TransformerSpec, seq_len: int, layers: range, first: bool,
                 last: bool, tp: TensorGroup, seed: int):
        super().__init__()
        check_supported(model)
        source = ParameterSource(seed)
        self.embedding = Embedding(model, seq_len, tp, source) if first else None
        self.layers = nn.ModuleList(Layer(model, i, tp, source) for i in layers)
        self.head = Head(model, tp, source) if last else None

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x, targets) if self.head is not None else x
