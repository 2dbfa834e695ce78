"""Workshop mode on the lab's server: a host's class board and a learner's page over the store
(``kvviz.store``), with the exercises (``kvviz.app.exercises``) checked against their stored runs.
``api`` holds the routes (``/workshop/...`` and ``/r/<id>``) that ``app.py`` adds beside the Gradio
page; ``pages`` the two pages (plain HTML and a little JavaScript, for phones and projectors);
``facts`` what an exercise shows before and after its reveal."""
