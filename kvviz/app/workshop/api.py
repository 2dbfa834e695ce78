"""The workshop's routes, added beside the Gradio page (``launch_app_kwargs()``; app.py passes them to
Gradio's FastAPI app with the one set of exception handlers): the pages, a JSON API under
``/workshop/api`` and the saved runs' short links.

Who is calling is one dependency (``guard.caller``: the host token and host page's session, the
projector's read-only key or a learner's session token, from their headers, and the client's
address); who may do what with them is the store's (``kvviz.store.classes.Workshop``). Bodies are
typed (``bodies``); what a request may do before it runs and how a refusal is answered, in one line
with its HTTP status, is ``guard``'s.

Saved runs: ``POST /workshop/api/runs`` keeps a run, ``/r/<id>`` reopens it on the lab's page.
"""

from __future__ import annotations

import threading
from urllib.parse import parse_qsl, urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.middleware import Middleware
from starlette.routing import Mount

from kvviz.app.exercises import EXERCISES, Sequence, check_prediction, grade, stored_results
from kvviz.app.workshop import bodies, facts, guard, joining, pages
from kvviz.core.policy import WorkshopCaps, workshop_caps
from kvviz.store.classes import Workshop
from kvviz.store.database import default_url, open_store, shown_url
from kvviz.store.runs import SavedRuns
from kvviz.store.values import Refused

JSON = [Depends(guard.json_from_this_site)]
WHO = Depends(guard.caller)
SAVE_PATH = "/workshop/api/runs"


class Service:
    """The store behind the routes, opened on first use (``open_store``: KVVIZ_DB_URL or the SQLite file),
    the exercises, the caps, each client's allowance and the address the server listens on."""

    def __init__(self, url: str | None = None, sequence: Sequence = EXERCISES, caps: WorkshopCaps | None = None,
                 listen_host: str = "127.0.0.1"):
        self.url, self.sequence, self.caps = url, sequence, caps or workshop_caps()
        self.listen_host = listen_host
        self.allowance = guard.Allowance(self.caps)
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

    @property
    def store_label(self) -> str:
        return shown_url(self.url or default_url())

    def cards(self, keys: list[str]) -> list[dict]:
        order = {exercise.key: index for index, exercise in enumerate(self.sequence.exercises)}
        return [facts.card(self.sequence.get(key), order[key] + 1) for key in keys if key in order]

    def reveals(self, keys: list[str]) -> dict:
        known = {exercise.key for exercise in self.sequence.exercises}
        return {key: facts.reveal(self.sequence.get(key)) for key in keys if key in known}

    def join_address(self, request: Request) -> joining.JoinAddress:
        return joining.join_address(self.listen_host, request.headers.get("host", ""), request.url.scheme)

    def shown_board(self, state: dict, request: Request, reveal: list[str]) -> dict:
        """A board as the pages draw it: its cards, the reveals of ``reveal``, where phones join."""
        address = self.join_address(request)
        return {**state, "cards": self.cards(state["exercises"]), "reveals": self.reveals(reveal),
                "join": {"url": address.url(state["code"]), "shown": address.shown(), "warning": address.warning}}


def html_page(text: str) -> HTMLResponse:
    return HTMLResponse(text, headers=pages.HEADERS)


def page_routes(router: APIRouter, service: Service) -> None:
    @router.get("/workshop", response_class=HTMLResponse)
    def landing() -> HTMLResponse:
        return html_page(pages.landing())

    @router.get("/workshop/class/{code}", response_class=HTMLResponse)
    def learner_page(code: str) -> HTMLResponse:
        return html_page(pages.learner(code))

    @router.get("/workshop/host/{code}", response_class=HTMLResponse)
    def host_page(code: str) -> HTMLResponse:
        return html_page(pages.host(code))

    @router.get("/workshop/projector/{code}", response_class=HTMLResponse)
    def projector_page(code: str) -> HTMLResponse:
        return html_page(pages.projector(code))

    @router.get("/workshop/join/{code}.svg")
    def join_code(code: str, request: Request) -> Response:
        """The QR code of the class's join address (the code is public: it is on the projector)."""
        url = service.join_address(request).url(pages.page_code(code))
        return Response(joining.qr_svg(url), media_type="image/svg+xml", headers={"Cache-Control": "no-store"})


def host_routes(router: APIRouter, service: Service) -> None:
    @router.post("/workshop/api/classes", dependencies=JSON)
    def create(body: bodies.NewClass, who: guard.Caller = WHO) -> dict:
        service.allowance.take("create", who)
        made = service.workshop.create_class([e.key for e in service.sequence.exercises], mode=body.mode)
        return {"code": made.code, "host_token": made.host_token, "expires_at": made.expires_at.isoformat(),
                "host_link": f"/workshop/host/{made.code}#{made.host_token}", "learner_link": f"/workshop/class/{made.code}"}

    @router.get("/workshop/api/classes/{code}/board")
    def board(code: str, request: Request, who: guard.Caller = WHO) -> dict:
        state = service.workshop.board(code, who.host_token)
        return service.shown_board(state, request, reveal=state["exercises"])  # the host may peek

    @router.get("/workshop/api/classes/{code}/projector")
    def projector(code: str, request: Request, who: guard.Caller = WHO) -> dict:
        state = service.workshop.projector_board(code, who.projector_key)
        return service.shown_board(state, request, reveal=state["revealed"])

    @router.post("/workshop/api/classes/{code}/host", dependencies=JSON)
    def control(code: str, body: bodies.HostChange, who: guard.Caller = WHO) -> dict:
        if not who.host_session:
            raise Refused("The host page sends its session (X-Host-Session): reload the host page.")
        return service.workshop.host_settings(code, who.host_token, who.host_session,
                                              take_over=body.take_over, open_exercise=body.open or None,
                                              reveal=body.reveal or None, mode=body.mode)

    @router.get("/workshop/api/classes/{code}/export.csv")
    def export(code: str, who: guard.Caller = WHO) -> Response:
        text = service.workshop.export_csv(code, who.host_token)
        filename = f"kvviz-class-{pages.page_code(code)}.csv"
        return PlainTextResponse(text, media_type="text/csv", headers={"Content-Disposition": f'attachment; filename="{filename}"'})

    @router.delete("/workshop/api/classes/{code}")
    def remove(code: str, who: guard.Caller = WHO) -> dict:
        service.workshop.delete_class(code, who.host_token)
        return {"deleted": pages.page_code(code)}

    @router.post("/workshop/api/classes/{code}/pins", dependencies=JSON)
    def pin(code: str, body: bodies.Pin, who: guard.Caller = WHO) -> dict:
        run_id = body.run.rstrip("/").rsplit("/r/", 1)[-1]
        service.runs.pin(service.workshop, code, who.host_token, run_id)
        return {"pinned": run_id.lower()}


def learner_routes(router: APIRouter, service: Service) -> None:
    @router.post("/workshop/api/join", dependencies=JSON)
    def join(body: bodies.Join) -> dict:
        seat = service.workshop.join(body.code, body.name)
        return {"code": seat.code, "name": seat.name, "token": seat.token}

    @router.get("/workshop/api/me")
    def me(who: guard.Caller = WHO) -> dict:
        view = service.workshop.learner_view(who.learner_token)
        view["cards"] = service.cards(view["exercises"])
        view["pinned"] = service.runs.pinned(service.workshop, who.learner_token)
        return view

    # A prediction is a few milliseconds of work: done on the server's event loop, it does not wait
    # for a thread of the pool and the interpreter lock behind the other requests of a burst
    @router.post("/workshop/api/predict", dependencies=JSON)
    async def predict(body: bodies.Predict, who: guard.Caller = WHO) -> dict:
        try:
            exercise = service.sequence.get(body.exercise)
        except KeyError:
            raise Refused(f"There is no exercise {body.exercise!r}.", 404) from None
        problem = check_prediction(exercise, body.value)
        if problem:
            raise Refused(problem)
        right = grade(exercise, body.value) if exercise.preset else None
        service.workshop.predict(who.learner_token, body.exercise, body.value, right)
        return {"exercise": body.exercise, "value": body.value}

    @router.get("/workshop/api/reveal/{key}")
    def reveal(key: str, who: guard.Caller = WHO) -> dict:
        if not service.workshop.may_reveal(who.learner_token, key):
            raise Refused("Predict first: the run shows after your prediction and the host's reveal.", 403)
        mine = service.workshop.learner_view(who.learner_token)["mine"].get(key)
        return {**facts.reveal(service.sequence.get(key)), "mine": mine,
                "room": service.workshop.room(who.learner_token, key)}


def run_routes(router: APIRouter, service: Service) -> None:
    @router.post(SAVE_PATH, dependencies=JSON)
    def save(body: bodies.SaveRun, who: guard.Caller = WHO) -> dict:
        service.allowance.take("save", who)
        run_id = service.runs.save(body.title, body.link, body.results)
        return {"id": run_id, "link": f"/r/{run_id}"}

    @router.get("/workshop/api/runs/{run_id}")
    def saved(run_id: str) -> dict:
        return service.runs.get(run_id)

    @router.get("/r/{run_id}")
    def reopen(run_id: str) -> Response:
        run = service.runs.get(run_id)
        query = [(name, value) for name, value in parse_qsl(run["link"], keep_blank_values=True) if name != "run"]
        return RedirectResponse("/?" + urlencode([*query, ("run", run["id"])]), status_code=307)


def routes(service: Service | None = None) -> list:
    """The workshop's routes and its static files, for ``FastAPI(routes=...)`` (Gradio's ``app_kwargs``)."""
    service = service or Service()
    router = APIRouter()
    page_routes(router, service)
    host_routes(router, service)
    learner_routes(router, service)
    run_routes(router, service)
    return [*router.routes, Mount("/workshop/static", StaticFiles(directory=pages.STATIC), name="workshop-static")]


def launch_app_kwargs(service: Service | None = None) -> dict:
    """What ``demo.launch(app_kwargs=...)`` takes to serve the workshop beside the page: its routes and
    the one set of exception handlers that answers every refusal in one line."""
    service = service or Service()
    save_bytes = service.caps.max_saved_run_bytes + guard.BODY_BYTES  # a run at its cap, with its title and link

    def body_limit(path: str) -> int | None:
        if path == SAVE_PATH:
            return save_bytes
        return guard.BODY_BYTES if path.startswith(guard.WORKSHOP_PATHS) else None

    return {"routes": routes(service), "exception_handlers": guard.handlers(service.store_label),
            "middleware": [Middleware(guard.BodyLimit, limit_of=body_limit)]}
