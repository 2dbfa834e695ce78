"""KVComm's Countries."""

from __future__ import annotations

from pathlib import Path

from kvviz.data.files import dataset_path, iter_jsonl, nonempty_str, optional_text
from kvviz.data.record import LoadReport, Record


def load_countries(*, data_dir: Path | None = None, report: LoadReport | None = None) -> list[Record]:
    """KVComm "Countries": sender sees "<person> is at <landmark>."; receiver asked the country."""
    report = report if report is not None else LoadReport("countries")
    path = dataset_path(data_dir, "kvcomm_countries", "countries.jsonl")
    records = []
    for line_no, obj in iter_jsonl(path, report):
        answer = obj.get("y", obj.get("country"))
        if not nonempty_str(obj.get("prompt_B")) or not nonempty_str(answer):
            report.add(path, line_no, "missing prompt_B or answer (y/country)")
            continue
        records.append(
            Record(
                id=str(obj.get("id", f"countries_{line_no:04d}")),
                question=obj["prompt_B"],
                context=optional_text(obj.get("prompt_A")),
                answers=[answer],
                choices=None,
                answer_index=None,
                source="countries",
                meta={k: obj[k] for k in ("person", "landmark") if k in obj},
            )
        )
    return records
