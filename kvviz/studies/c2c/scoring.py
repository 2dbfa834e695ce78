"""How well the receiver predicts a response: NLL through the frozen receiver, fused or not.

``answer_nll`` scores a response from any prepared receiver state (the receiver after its prompt
minus the last token): the fuser's training loss and every held-out NLL go through it, and so can
any other way of preparing that state (a translated cache). ``response_nll`` prepares the state
with a fuser (``kvviz.handoffs.c2c.fusion``) or without one (the receiver alone).

Speed on a CPU: the output head runs at the response positions only (Gemma 3's 262k-row head is
the costliest single matrix); the prompt prefills run without gradients and without the head.
"""

from __future__ import annotations

import torch

from kvviz.handoffs.c2c.fuser import C2CFuser
from kvviz.handoffs.c2c.fusion import fuse_prompt, receiver_prefix
from kvviz.runtime.decode import forward_kwargs
from kvviz.studies.c2c.examples import Example


def answer_nll(receiver, state, example: Example) -> tuple[torch.Tensor, int]:
    """(summed cross-entropy over the response tokens, token count): the receiver, on ``state``
    (its prompt minus the last token), reads the last prompt token and the response.
    Differentiable in whatever made ``state``."""
    tokens = example.alignment.receiver_ids[-1:] + example.response_ids[:-1]
    targets = torch.tensor(example.response_ids, device=receiver.device)
    input_ids = torch.tensor([tokens], device=receiver.device)
    hidden = receiver.model.model(input_ids=input_ids, **forward_kwargs(receiver, state, len(tokens))).last_hidden_state[0]
    logits = receiver.head.logits(hidden)
    loss = torch.nn.functional.cross_entropy(logits, targets, reduction="sum")
    return loss, len(example.response_ids)


def fused_state(pair, fuser: C2CFuser | None, example: Example, hard: bool | None = None, sharer="right"):
    """The receiver's state after its prompt minus the last token, fused (``kvviz.handoffs.c2c.fusion``) or not."""
    if fuser is None:
        return receiver_prefix(pair, example.alignment)
    return fuse_prompt(pair, fuser, example.alignment, sharer=sharer, hard=hard).state


def response_nll(
    pair, fuser: C2CFuser | None, example: Example, hard: bool | None = None, sharer="right"
) -> tuple[torch.Tensor, int]:
    """``answer_nll`` on the fused state; differentiable in the fuser.

    ``sharer``: what the fuser reads (``kvviz.handoffs.c2c.fusion.fuse_prompt``): "right", "zero" or a SharerKV.
    """
    return answer_nll(pair.receiver, fused_state(pair, fuser, example, hard, sharer), example)


@torch.no_grad()
def example_nlls(pair, fuser: C2CFuser | None, examples: list[Example], sharer_for=None) -> list[tuple[float, int]]:
    """(summed NLL, tokens) per example with hard gates (as at inference).

    ``sharer_for(index)`` gives what the fuser reads for example ``index`` (default "right").
    """
    if fuser is not None:
        fuser.eval()
    rows = []
    for index, example in enumerate(examples):
        sharer = "right" if sharer_for is None else sharer_for(index)
        loss, n = response_nll(pair, fuser, example, hard=True, sharer=sharer)
        rows.append((float(loss), n))
    return rows


def per_token(rows: list[tuple[float, int]]) -> float:
    """Per-token NLL of (summed NLL, tokens) rows."""
    return sum(r[0] for r in rows) / max(sum(r[1] for r in rows), 1)


def mean_nll(pair, fuser: C2CFuser | None, examples: list[Example], sharer_for=None) -> float:
    """Per-token NLL over examples with hard gates (as at inference)."""
    return per_token(example_nlls(pair, fuser, examples, sharer_for))
