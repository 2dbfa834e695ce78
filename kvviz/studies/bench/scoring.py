"""Scoring a benchmark answer: every correctness column, the multiple-choice likelihood column,
and the row a result becomes.

Open answers: token F1 > 0.5 with a gold answer (the KVComm paper's metric) and containment of a
gold answer. Multiple choice: the letter the model writes (``kvviz.data.choices``, the same prompt
and extractor as ``eval-fuser``) and, as a second column, the option with the highest likelihood
under the receiver in the state the handoff left it in (log-probability of the option text after
the prompt, divided by the option's length in bytes, as lm-eval's acc_norm). The handoff's
descriptor rebuilds that state (``receiver_prompt``) or says why it cannot.
"""

from __future__ import annotations

import torch

from kvviz.core.prompts import encode
from kvviz.core.results import STAGES, HandoffRequest, HandoffResult
from kvviz.data import LETTERS, contains_answer, extract_choice_letter, f1_match, token_f1
from kvviz.handoffs import registry
from kvviz.handoffs.registry import ReceiverPrompt
from kvviz.runtime import cache as kv
from kvviz.runtime.decode import full_logits
from kvviz.studies.bench.rows import COLUMNS


def score_answer(record, answer: str) -> dict:
    """Every correctness column that depends only on the answer text."""
    out: dict = {"gold": " | ".join(record.answers)}
    out["f1"] = round(max((token_f1(answer, gold) for gold in record.answers), default=0.0), 4)
    out["correct_f1"] = int(f1_match(answer, record.answers))
    out["correct_contains"] = int(contains_answer(answer, record.answers))
    if record.choices is None:
        out["kind"] = "open"
        out["correct"] = out["correct_f1"]
    else:
        out["kind"] = "choice"
        gold_letter = LETTERS[record.answer_index]
        letter = extract_choice_letter(answer, len(record.choices))
        out["gold"] = f"{gold_letter}. {record.choices[record.answer_index]}"
        out["gold_letter"] = gold_letter
        out["answer_letter"] = letter or ""
        out["correct_letter"] = int(letter == gold_letter)
        out["correct"] = out["correct_letter"]
    return out


@torch.no_grad()
def option_scores(prompt: ReceiverPrompt, options: list[str]) -> list[float]:
    """Length-normalised log-likelihood of each option continuing the prompt (on copies of the state)."""
    model, state = prompt.model, prompt.state
    first = torch.log_softmax(prompt.next_token.logits[0], dim=-1)
    tokenizer = model.tokenizer
    separator = "" if tokenizer.decode([prompt.last_token]).endswith((" ", "\n")) else " "
    scores = []
    for option in options:
        ids = encode(tokenizer, separator + option.strip())
        total = float(first[ids[0]])
        if len(ids) > 1:
            copy = kv.KVState(
                cache=kv.copy_cache(state.cache), next_position=state.next_position, prefix_positions=dict(state.prefix_positions)
            )
            rest = torch.log_softmax(full_logits(model, copy, ids[:-1]), dim=-1)
            total += float(sum(rest[i, ids[i + 1]] for i in range(len(ids) - 1)))
        scores.append(total / max(1, len(option.strip().encode("utf-8"))))
    return scores


def best_option(scores: list[float]) -> int:
    """The index of the highest score (the first one on a tie)."""
    return max(range(len(scores)), key=lambda index: (scores[index], -index))


def choice_likelihoods(pair, record, handoff: str, request: HandoffRequest, result: HandoffResult) -> list[float] | None:
    """``option_scores`` of the record's choices in the state the handoff left the receiver in;
    None when the handoff's descriptor cannot rebuild that state."""
    descriptor = registry.get(handoff)
    if descriptor.receiver_prompt is None:
        return None
    return option_scores(descriptor.receiver_prompt(pair, request, result), record.choices)


def likelihood_columns(pair, record, handoff: str, request: HandoffRequest, result: HandoffResult) -> dict:
    if record.choices is None:
        return {}
    scores = choice_likelihoods(pair, record, handoff, request, result)
    if scores is None:
        return {"likelihood_note": registry.get(handoff).no_receiver_prompt}
    best = best_option(scores)
    return {"likelihood_letter": LETTERS[best], "correct_likelihood": int(best == record.answer_index)}


def result_row(record, index: int, variant, result: HandoffResult, args, rank: int, world: int) -> dict:
    """The CSV row of one sample and variant (``rows.COLUMNS``)."""
    row = {column: "" for column in COLUMNS}
    row.update(
        dataset=args.dataset,
        pair=args.pair,
        sample_index=index,
        sample_id=record.id,
        variant=variant.label,
        handoff=variant.handoff,
        # the KVComm-style swept settings have their own columns; any swept value is in the label
        strategy=variant.options.get("strategy", ""),
        ratio=variant.options.get("ratio", ""),
        applicable=int(result.applicable),
        reason=result.reason,
        question=record.question,
        rank=rank,
        world_size=world,
        seed=args.seed,
    )
    if not result.applicable:
        row["gold"] = " | ".join(record.answers)
        row["kind"] = "open" if record.choices is None else "choice"
        return row
    row["answer"] = result.answer
    row.update(score_answer(record, result.answer))
    for stage in STAGES:
        row[f"time_{stage}"] = round(result.timings.get(stage, 0.0), 6)
    row["time_total"] = round(result.timings.get("total", 0.0), 6)
    row["ttft"] = "" if result.first_token_seconds is None else round(result.first_token_seconds, 6)
    row["bytes"] = result.bytes_communicated
    row["communication"] = result.communication
    row["flops_sharer"] = result.flops.get("sharer", 0.0)
    row["flops_receiver"] = result.flops.get("receiver", 0.0)
    row["flops_total"] = sum(result.flops.values())
    row["generated_tokens"] = result.tokens.get("generated", len(result.answer_ids))
    row["message"] = result.seen.get("message", "")
    if "selected_layers" in result.details:
        row["selected_layers"] = ";".join(str(layer) for layer in result.details["selected_layers"])
    return row
