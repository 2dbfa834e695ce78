"""Workshop mode on the lab's server: a host's class board, a projector and a learner's page over the
store (``kvviz.store``), with the exercises (``kvviz.app.exercises``) checked against their stored runs.
``api`` holds the routes (``/workshop/...`` and ``/r/<id>``) that ``app.py`` adds beside the Gradio
page; ``guard`` what a request may do before a route runs and the one way a refusal is answered;
``bodies`` the typed request bodies; ``pages`` the pages (HTML, CSS and JavaScript in ``static/``,
for phones and projectors); ``joining`` where phones join, with its QR code; ``facts`` what an
exercise shows before and after its reveal."""
