"""What ``python -m kvviz train-translator`` trains a KV translator on: the receiver side, through the
frozen receiver, both models frozen.

* **Against Skyline** (``ReceiverLoss``, issue 31): the translated note, then the receiver reads what
  follows it (a question, or the note's own continuation) and is scored on each next token against
  **Skyline as teacher** (the same receiver reading the note itself): the KL divergence from
  Skyline's next-token distribution plus the gold token's cross-entropy. The 262k-token head is
  restricted to Skyline's ``top_k`` likeliest tokens and the gold one (``teacher_targets``): both
  distributions are renormalised over those, so a step costs a few hundred head rows instead of
  the whole vocabulary. The gradient flows back through the frozen receiver into the translator;
  what it learns is what the receiver does with the KV, not the KV itself.
* **Follow the note** (``FollowLoss``, issue 43), on top of that:

  - a note with a **swap twin** (the same note with its answer-bearing fact changed,
    ``kvviz.data.swaps``) is scored with its twin in the same step, and at the first answer token
    where the two answers differ (both read the same answer tokens before it) each must put its own
    answer's token above the other's by ``follow_margin`` nats (a softplus hinge on the full head):
    one translator, each note's own answer;
  - a **mismatched** note (a question over another note's context) is scored by the **harm guard**
    (Draft-KV's): ``relu(NLL(answer | the other note, translated) - NLL(answer | the receiver alone) -
    harm_tolerance)``, both over the receiver alone's candidates, per answer token. The receiver
    alone's NLL carries no gradient, so the guard never rewards making the control worse: it only
    stops a note that does not hold the answer from making the answer worse than no note at all.

Every loss reads the translated note through ``Prefix.reading`` (a side-memory translator's branch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvviz.handoffs.translate import align as tr_align
from kvviz.handoffs.translate import prefix as tr_prefix
from kvviz.handoffs.translate import side
from kvviz.handoffs.translate import translator as tr
from kvviz.runtime import cache as kv
from kvviz.runtime.decode import forward_kwargs, prefill
from kvviz.studies.c2c.translator_data import Note, target_ids


def receiver_hidden(receiver, state: kv.KVState, read_ids: list[int], target_ids: list[int]) -> torch.Tensor:
    """The receiver's final hidden states [P, H] at the positions that predict each of ``target_ids``
    after it reads ``read_ids`` on ``state`` (teacher-forced; differentiable in what built the state)."""
    tokens = read_ids + target_ids[:-1]
    kwargs = forward_kwargs(receiver, state, len(tokens))
    hidden = receiver.model.model(input_ids=torch.tensor([tokens], device=receiver.device), **kwargs).last_hidden_state[0]
    state.next_position += len(tokens)
    return hidden[len(read_ids) - 1:]


def head_logits(receiver, hidden: torch.Tensor, candidates: torch.Tensor | None = None) -> torch.Tensor:
    """The receiver's logits [P, K] of ``candidates`` [P, K] only (its head rows, softcap included);
    with ``candidates`` None, over the whole vocabulary [P, V] (a few positions only)."""
    weight = receiver.head.linear.weight
    if candidates is None:
        logits = F.linear(hidden.to(weight.dtype), weight).float()
    else:
        logits = torch.einsum("ph,pkh->pk", hidden.to(weight.dtype), weight[candidates]).float()
    softcap = receiver.head.softcap
    return torch.tanh(logits / softcap) * softcap if softcap else logits


@dataclass
class Teacher:
    """Skyline's next-token distribution at each scored position, over a few candidate tokens."""

    candidates: torch.Tensor  # [P, K] token ids: Skyline's top_k, the gold token among them (last when it was not)
    log_probs: torch.Tensor  # [P, K] Skyline's log-probabilities renormalised over the candidates
    gold: torch.Tensor  # [P] the gold token's index among the candidates

    def gold_nll(self) -> torch.Tensor:
        return -self.log_probs.gather(1, self.gold[:, None]).mean()


@torch.no_grad()
def teacher_targets(receiver, context_ids: list[int], read_ids: list[int], target_ids: list[int], top_k: int) -> Teacher:
    """Skyline reads ``context_ids`` (the receiver's own ``<bos>Context: note``; the receiver alone's
    tokens for the harm guard), then ``read_ids`` and the target; at each position that predicts a
    target token, its ``top_k`` likeliest tokens plus the gold one and its distribution over them."""
    state = kv.KVState()
    prefill(receiver, state, context_ids, need_logits=False)
    hidden = receiver_hidden(receiver, state, read_ids, target_ids)
    logits = receiver.head.logits(hidden)
    top = torch.topk(logits, top_k, dim=-1).indices
    gold = torch.tensor(target_ids, device=top.device)
    found = top == gold[:, None]
    missing = ~found.any(-1)
    top[missing, -1] = gold[missing]  # the gold token takes the last candidate's place
    found = top == gold[:, None]
    log_probs = torch.log_softmax(logits.gather(1, top), dim=-1)
    return Teacher(candidates=top, log_probs=log_probs, gold=found.float().argmax(-1))


def translated_hidden(pair, translator: tr.KVTranslator, context: str, read_ids: list[int], target_ids: list[int]):
    """(the receiver's hidden states after the translated ``context``, as ``receiver_hidden`` gives
    them, the alignment): soft gates, differentiable in the translator."""
    receiver = pair.receiver
    alignment = tr_align.align_context(receiver.tokenizer, pair.sharer.tokenizer, context, translator.config.sharer_start)
    prefix, _, _ = tr_prefix.translate(pair, translator, alignment, hard=False)
    with prefix.reading(receiver):
        return receiver_hidden(receiver, prefix.state, read_ids, target_ids), alignment


@dataclass
class ReceiverLoss:
    """KL from Skyline (``kd_weight``) plus the gold token's cross-entropy (``ce_weight``), both over
    Skyline's candidates, averaged over the scored positions."""

    kd_weight: float = 1.0
    ce_weight: float = 1.0
    top_k: int = 32

    def __call__(self, pair, translator: tr.KVTranslator, context: str, read_ids: list[int], target_ids: list[int]):
        """(loss, {"kd": ..., "ce": ...}) for one note: soft gates, differentiable in the translator."""
        loss, parts, _ = self.scored(pair, translator, context, read_ids, target_ids)
        return loss, parts

    def scored(self, pair, translator, context: str, read_ids: list[int], target_ids: list[int]):
        """(loss, parts, the student's hidden states): ``__call__`` keeping what the follow term reads."""
        receiver = pair.receiver
        hidden, alignment = translated_hidden(pair, translator, context, read_ids, target_ids)
        teacher = teacher_targets(receiver, alignment.receiver_ids, read_ids, target_ids, self.top_k)
        student = torch.log_softmax(head_logits(receiver, hidden, teacher.candidates), dim=-1)
        kd = (teacher.log_probs.exp() * (teacher.log_probs - student)).sum(-1).mean()
        ce = -student.gather(1, teacher.gold[:, None]).mean()
        return self.kd_weight * kd + self.ce_weight * ce, {"kd": float(kd.detach()), "ce": float(ce.detach())}, hidden


def first_difference(first: list[int], second: list[int]) -> int | None:
    """The first position where two answers' tokens differ (" United States" / " United Kingdom": 1),
    or None when one is the other's beginning."""
    return next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), None)


@dataclass
class FollowLoss:
    """``ReceiverLoss`` on every note (and its twin), the follow hinge on swap pairs, the harm guard
    on mismatched notes (the module docstring). With both weights 0 and no twins or mismatched notes
    it is ``ReceiverLoss`` exactly."""

    receiver: ReceiverLoss
    follow_weight: float = 1.0
    follow_margin: float = 2.0  # nats between a note's own answer and its twin's, where their tokens first differ
    harm_weight: float = 1.0
    harm_tolerance: float = 0.1  # nats per answer token the translated other note may cost

    def __call__(self, pair, translator: tr.KVTranslator, note: Note):
        """(loss, parts) for one note: the parts are floats for the log ("kd", "ce"; "follow" and
        "follow_gap" on a swap pair; "harm" on a mismatched note)."""
        tokenizer = pair.receiver.tokenizer
        read, target = target_ids(tokenizer, note)
        if note.kind == "mismatched":
            return self.harm(pair, translator, note.context, read, target)
        loss, parts, hidden = self.receiver.scored(pair, translator, note.context, read, target)
        if note.twin is None:
            return loss, parts
        twin_read, twin_target = target_ids(tokenizer, note.twin)
        twin_loss, twin_parts, twin_hidden = self.receiver.scored(pair, translator, note.twin.context, twin_read, twin_target)
        loss = (loss + twin_loss) / 2
        parts = {k: (parts[k] + twin_parts[k]) / 2 for k in parts}
        at = first_difference(target, twin_target)
        if at is None or not self.follow_weight:
            return loss, parts
        own, other = target[at], twin_target[at]
        first = torch.log_softmax(head_logits(pair.receiver, torch.stack([hidden[at], twin_hidden[at]])), dim=-1)
        gaps = torch.stack([first[0, own] - first[0, other], first[1, other] - first[1, own]])
        follow = F.softplus(self.follow_margin - gaps).mean()
        parts.update(follow=float(follow.detach()), follow_gap=float(gaps.detach().mean()))
        return loss + self.follow_weight * follow, parts

    def harm(self, pair, translator, context: str, read: list[int], target: list[int]):
        """The harm guard: the answer after another note's translation against the receiver alone."""
        receiver = pair.receiver
        alone = teacher_targets(receiver, side.alone_ids(receiver), read, target, self.receiver.top_k)
        hidden, _ = translated_hidden(pair, translator, context, read, target)
        student = torch.log_softmax(head_logits(receiver, hidden, alone.candidates), dim=-1)
        excess = -student.gather(1, alone.gold[:, None]).mean() - alone.gold_nll()
        harm = F.relu(excess - self.harm_tolerance)
        return self.harm_weight * harm, {"harm": float(harm.detach()), "harm_excess": float(excess.detach())}
