"""The workshop's routes, added beside the Gradio page (``routes()``; app.py passes them to Gradio's
FastAPI app): the pages, a JSON API under ``/workshop/api`` and the saved runs' short links.

Who may do what is the store's (``kvviz.store.classes.Workshop``): the host's requests carry the
host token (header ``X-Host-Token``; the host link keeps it after ``#``, so it never reaches a
server log) and the host page's session (``X-Host-Session``); a learner's carry their session
token (``X-Learner-Token``). A refusal answers ``{"error": one line}`` with its HTTP status.

Pages: ``/workshop`` (join a class or make one), ``/workshop/class/<code>`` (a learner's),
``/workshop/host/<code>#<token>`` (the host's board; ``?projector=1`` for large type).
Saved runs: ``POST /workshop/api/runs`` keeps a run, ``/r/<id>`` reopens it on the lab's page.
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Callable
from urllib.parse import parse_qsl, urlencode

from fastapi import APIRouter, Body, Header
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response

from kvviz.app.exercises import EXERCISES, Sequence, check_prediction, grade, stored_results
from kvviz.app.workshop import facts, pages
from kvviz.core.policy import WorkshopCaps, workshop_caps
from kvviz.store.classes import Refused, Workshop
from kvviz.store.database import default_url, open_store
from kvviz.store.runs import SavedRuns


class Service:
    """The store behind the routes, opened on first use (``open_store``: KVVIZ_DB_URL or the SQLite file)."""

    def __init__(self, url: str | None = None, sequence: Sequence = EXERCISES, caps: WorkshopCaps | None = None):
        self.url, self.sequence, self.caps = url, sequence, caps or workshop_caps()
        self._lock = threading.Lock()
        self._workshop: Workshop | None = None
        self._runs: SavedRuns | None = None

    def open(self) -> tuple[Workshop, SavedRuns]:
        with self._lock:
            if self._workshop is None:
                engine = open_store(self.url)
                self._workshop, self._runs = Workshop(engine, self.caps), SavedRuns(engine, self.caps)
                for exercise in self.sequence.exercises:  # read the stored runs now, not in the first predictions
                    stored_results(exercise)
            return self._workshop, self._runs

    @property
    def workshop(self) -> Workshop:
        return self.open()[0]

    @property
    def runs(self) -> SavedRuns:
        return self.open()[1]

    def cards(self, keys: list[str]) -> list[dict]:
        order = {exercise.key: index for index, exercise in enumerate(self.sequence.exercises)}
        return [facts.card(self.sequence.get(key), order[key] + 1) for key in keys if key in order]


def refusing(handler: Callable) -> Callable:
    """A route whose Refused (and bad JSON) answers ``{"error": line}`` with its status."""

    if inspect.iscoroutinefunction(handler):
        @functools.wraps(handler)
        async def waited(*args, **kwargs):
            try:
                return await handler(*args, **kwargs)
            except Refused as refusal:
                return JSONResponse({"error": refusal.line}, status_code=refusal.status)

        return waited

    @functools.wraps(handler)
    def wrapped(*args, **kwargs):
        try:
            return handler(*args, **kwargs)
        except Refused as refusal:
            return JSONResponse({"error": refusal.line}, status_code=refusal.status)

    return wrapped


def text_field(body: dict, name: str, limit: int = 200) -> str:
    value = body.get(name, "") if isinstance(body, dict) else ""
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise Refused(f"{name} must be text.")
    return str(value)[:limit]


def page_routes(router: APIRouter) -> None:
    @router.get("/workshop", response_class=HTMLResponse)
    def landing() -> str:
        return pages.landing()

    @router.get("/workshop/class/{code}", response_class=HTMLResponse)
    def learner_page(code: str) -> str:
        return pages.learner(code)

    @router.get("/workshop/host/{code}", response_class=HTMLResponse)
    def host_page(code: str, projector: int = 0) -> str:
        return pages.host(code, projector=bool(projector))


def host_routes(router: APIRouter, service: Service) -> None:
    @router.post("/workshop/api/classes")
    @refusing
    def create(body: dict = Body(default={})) -> dict:
        mode = text_field(body, "mode") or "paced"
        made = service.workshop.create_class([e.key for e in service.sequence.exercises], mode=mode)
        return {"code": made.code, "host_token": made.host_token, "expires_at": made.expires_at.isoformat(),
                "host_link": f"/workshop/host/{made.code}#{made.host_token}", "learner_link": f"/workshop/class/{made.code}"}

    @router.get("/workshop/api/classes/{code}/board")
    @refusing
    def board(code: str, x_host_token: str = Header(default="")) -> dict:
        state = service.workshop.board(code, x_host_token)
        state["cards"] = service.cards(state["exercises"])
        state["reveals"] = {key: facts.reveal(service.sequence.get(key)) for key in state["exercises"]
                            if key in {e.key for e in service.sequence.exercises}}
        return state

    @router.post("/workshop/api/classes/{code}/host")
    @refusing
    def control(code: str, body: dict = Body(default={}), x_host_token: str = Header(default=""),
                x_host_session: str = Header(default="")) -> dict:
        if not x_host_session:
            raise Refused("The host page sends its session (X-Host-Session): reload the host page.")
        return service.workshop.host_settings(
            code, x_host_token, x_host_session[:64], take_over=bool(body.get("take_over")),
            open_exercise=body.get("open") or None, reveal=body.get("reveal") or None, mode=body.get("mode") or None)

    @router.get("/workshop/api/classes/{code}/export.csv")
    @refusing
    def export(code: str, x_host_token: str = Header(default="")) -> Response:
        return PlainTextResponse(service.workshop.export_csv(code, x_host_token), media_type="text/csv",
                                 headers={"Content-Disposition": f'attachment; filename="kvviz-class-{code.upper()}.csv"'})

    @router.delete("/workshop/api/classes/{code}")
    @refusing
    def remove(code: str, x_host_token: str = Header(default="")) -> dict:
        service.workshop.delete_class(code, x_host_token)
        return {"deleted": code.upper()}

    @router.post("/workshop/api/classes/{code}/pins")
    @refusing
    def pin(code: str, body: dict = Body(default={}), x_host_token: str = Header(default="")) -> dict:
        service.runs.pin(service.workshop, code, x_host_token, text_field(body, "run", 16))
        return {"pinned": body.get("run")}


def learner_routes(router: APIRouter, service: Service) -> None:
    @router.post("/workshop/api/join")
    @refusing
    def join(body: dict = Body(default={})) -> dict:
        seat = service.workshop.join(text_field(body, "code", 12), text_field(body, "name", 200))
        return {"code": seat.code, "name": seat.name, "token": seat.token}

    @router.get("/workshop/api/me")
    @refusing
    def me(x_learner_token: str = Header(default="")) -> dict:
        view = service.workshop.learner_view(x_learner_token)
        view["cards"] = service.cards(view["exercises"])
        view["pinned"] = service.runs.pinned(service.workshop, x_learner_token)
        return view

    # A prediction is a few milliseconds of work: done on the server's event loop, it does not wait
    # for a thread of the pool and the interpreter lock behind the other requests of a burst
    @router.post("/workshop/api/predict")
    @refusing
    async def predict(body: dict = Body(default={}), x_learner_token: str = Header(default="")) -> dict:
        key, value = text_field(body, "exercise", 64), text_field(body, "value", 200).strip()
        try:
            exercise = service.sequence.get(key)
        except KeyError:
            raise Refused(f"There is no exercise {key!r}.", 404) from None
        problem = check_prediction(exercise, value)
        if problem:
            raise Refused(problem)
        right = grade(exercise, value) if exercise.preset else None
        service.workshop.predict(x_learner_token, key, value, right)
        return {"exercise": key, "value": value}

    @router.get("/workshop/api/reveal/{key}")
    @refusing
    def reveal(key: str, x_learner_token: str = Header(default="")) -> dict:
        if not service.workshop.may_reveal(x_learner_token, key):
            raise Refused("Predict first: the run shows after your prediction and the host's reveal.", 403)
        mine = service.workshop.learner_view(x_learner_token)["mine"].get(key)
        return {**facts.reveal(service.sequence.get(key)), "mine": mine,
                "room": service.workshop.room(x_learner_token, key)}


def run_routes(router: APIRouter, service: Service) -> None:
    @router.post("/workshop/api/runs")
    @refusing
    def save(body: dict = Body(default={})) -> dict:
        link, results = text_field(body, "link", 20_000), body.get("results") if isinstance(body, dict) else None
        if not isinstance(results, dict):
            raise Refused("results must be the page's results (a JSON object).")
        run_id = service.runs.save(text_field(body, "title"), link, results)
        return {"id": run_id, "link": f"/r/{run_id}"}

    @router.get("/workshop/api/runs/{run_id}")
    @refusing
    def saved(run_id: str) -> dict:
        return service.runs.get(run_id)

    @router.get("/r/{run_id}")
    @refusing
    def reopen(run_id: str) -> Response:
        run = service.runs.get(run_id)
        query = [(name, value) for name, value in parse_qsl(run["link"], keep_blank_values=True) if name != "run"]
        return RedirectResponse("/?" + urlencode([*query, ("run", run["id"])]), status_code=307)


def routes(service: Service | None = None) -> list:
    """The workshop's routes, for ``FastAPI(routes=...)`` (Gradio's ``app_kwargs``)."""
    service = service or Service()
    router = APIRouter()
    page_routes(router)
    host_routes(router, service)
    learner_routes(router, service)
    run_routes(router, service)
    return list(router.routes)


def store_label() -> str:
    """Where the store is, without a password: for the server's first lines."""
    url = default_url()
    return url.split("@", 1)[-1] if "@" in url else url


def launch_app_kwargs(service: Service | None = None) -> dict:
    """What ``demo.launch(app_kwargs=...)`` takes to serve the workshop beside the page."""
    return {"routes": routes(service)}
