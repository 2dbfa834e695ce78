"""HotpotQA dev (distractor), its first 103 questions."""

from __future__ import annotations

from pathlib import Path

from kvviz.data.files import dataset_path, iter_json_array, nonempty_str
from kvviz.data.record import LoadReport, Record


def load_hotpotqa(
    *,
    all_paragraphs: bool = False,
    supporting_paragraphs: bool = False,
    data_dir: Path | None = None,
    report: LoadReport | None = None,
) -> list[Record]:
    """HotpotQA dev (distractor), first 103 questions.

    By default the context is only the supporting-fact sentences, one per
    line, which is what KVComm puts in the sender prompt.  With
    ``all_paragraphs=True`` it is every paragraph (gold and distractors) as
    "title\\ntext" blocks separated by blank lines; with ``supporting_paragraphs=True`` the
    whole paragraphs that hold the supporting facts, in the same shape (a passage, not a
    list of facts: the KV translator's held-out paragraphs, ``kvviz.data.passages``).
    """
    if all_paragraphs and supporting_paragraphs:
        raise ValueError("choose all_paragraphs or supporting_paragraphs, not both")
    report = report if report is not None else LoadReport("hotpotqa")
    path = dataset_path(data_dir, "hotpotqa_dev_first103", "hotpot_dev_distractor_v1_first103.json")
    records = []
    for item_no, obj in iter_json_array(path, report):
        if not nonempty_str(obj.get("question")) or not nonempty_str(obj.get("answer")):
            report.add(path, item_no, "missing question or answer")
            continue
        paragraphs = {title: sentences for title, sentences in obj.get("context", [])}
        if all_paragraphs or supporting_paragraphs:
            wanted = {title for title, _ in obj.get("supporting_facts", [])}
            # Sentences carry their own leading spaces, so "".join reads naturally.
            context = "\n\n".join(
                f"{title}\n{''.join(sentences).strip()}" for title, sentences in obj["context"]
                if all_paragraphs or title in wanted
            )
            if not context:
                report.add(path, item_no, "no supporting paragraph found")
                continue
        else:
            support = []
            for title, sent_id in obj.get("supporting_facts", []):
                sentences = paragraphs.get(title, [])
                if 0 <= sent_id < len(sentences):
                    support.append(sentences[sent_id].strip())
                else:
                    # KVComm only prints a warning here; we keep the record
                    # with the facts that exist but say so in the report.
                    report.add(path, item_no, f"supporting fact {title!r}[{sent_id}] not in context (kept record)")
            if not support:
                report.add(path, item_no, "no supporting-fact sentence found")
                continue
            context = "\n".join(support)
        records.append(
            Record(
                id=str(obj.get("_id", f"hotpotqa_{item_no:04d}")),
                question=obj["question"],
                context=context,
                answers=[obj["answer"]],
                choices=None,
                answer_index=None,
                source="hotpotqa",
                meta={k: obj[k] for k in ("type", "level") if k in obj},
            )
        )
    return records
