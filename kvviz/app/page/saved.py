"""Saved runs on the lab's page: *Save run* keeps the page's state and results in the workshop store
(``kvviz.store.runs``) under a short id, and ``/r/<id>`` (``kvviz.app.workshop.api``) reopens the
page with ``?...&run=<id>``: the link's state as any permalink restores it, then the saved results
painted in place of the preset's, with no model run. Each address may save as many runs a while as the
workshop's route allows it (``saves_per_client``), counted by this page's own allowance."""

from __future__ import annotations

import functools
import logging

from sqlalchemy.exc import SQLAlchemyError

from kvviz.app import tokenview
from kvviz.app.page import views
from kvviz.core.policy import workshop_caps
from kvviz.store.allowance import Allowance
from kvviz.store.database import UNWRITABLE, default_url, open_store, shown_url
from kvviz.store.runs import SavedRuns
from kvviz.store.values import Refused

LOG = logging.getLogger("kvviz.app.page")

# the short link in the address bar and on the clipboard
COPY_SAVED_JS = """
(link) => {
  if (!link) return [];
  const url = location.origin + link;
  history.replaceState(null, '', url);
  if (navigator.clipboard) navigator.clipboard.writeText(url).catch(() => {});
  return [];
}
"""


def store() -> SavedRuns:
    """The saved runs in the store the workshop's routes use (``KVVIZ_DB_URL``, else the SQLite file)."""
    return SavedRuns(open_store())


@functools.cache
def allowance() -> Allowance:
    """The page's one allowance of saved runs per address, for as long as the server runs."""
    return Allowance(workshop_caps())


def save(results: dict | None, link: str, title: str, address: str) -> dict:
    """Keep the page's run for the client at ``address``; the page's updates: the short link and a
    status line (or why not)."""
    if not (results or {}).get("results"):
        return {"status": "Nothing to save yet: run a question or pick a preset first.", "saved_link": ""}
    try:
        allowance().take("save", address)
        try:
            run_id = store().save(title, link, results)
        except Refused as refusal:
            if refusal.status != 413:
                raise
            run_id = store().save(title, link, tokenview.payload_without_arrays(results))  # without the attention arrays
    except Refused as refusal:
        return {"status": refusal.line, "saved_link": ""}
    except (SQLAlchemyError, OSError) as error:  # the page keeps working; where the store is goes to the log
        LOG.error("Save run: the store (%s) failed: %s", shown_url(default_url()), type(error).__name__)
        return {"status": UNWRITABLE, "saved_link": ""}
    return {"status": f"Saved: **/r/{run_id}** (copied; it reopens these results without a model).",
            "saved_link": f"/r/{run_id}"}


def saved_results(params: dict) -> tuple[str, dict] | None:
    """The saved run a link names (``run=<id>``): (id, its results), or None (no run, or an unknown one)."""
    run_id = str(params.get("run") or "").strip()
    if not run_id:
        return None
    try:
        run = store().get(run_id)
    except (Refused, SQLAlchemyError, OSError):
        return None
    return run["id"], run["results"]


def restored_run(run_id: str, payload: dict, names: list[str], answers, presets: views.PresetRuns | None = None) -> dict:
    """The page's updates that paint a saved run's results (its cards, strip, its preset's lesson line
    read against them, and status)."""
    shown = views.cards_and_verdict(payload, names, answers, views.subject_of(payload))
    return {"results": payload, **shown, "lesson": views.lesson_of(shown["reading"], presets),
            "status": f"Saved run **{run_id}**: its results as they were saved, no model run."}
