"""The lab's page, in small pieces (``kvviz.app.ui.build_demo`` puts them together).

* ``spec``: what the page shows, read from the registry, the catalog and the presets (columns,
  tabs, figures, options, the expected answer, the swap fields): no Gradio; ``steps`` (the
  walk-through and its predictions) and ``links`` (the page's state in a URL) beside it;
* ``theme``: CSS and the theme (every text at least 4.5:1);
* ``tabs``: what each tab draws for a run's reading (figures built once per preset or shared run);
* ``views``: what the page shows for a run's reading (cards, strip, lesson, whether the cards answer
  the question asked, the swapped note), and the presets' stored runs read once: no Gradio;
* ``named``, ``widgets``, ``layout``: the ``Page`` of named components, the widgets Gradio does not
  give as they are (and the page's script), and the functions that build it;
* ``run``: a live run as a stream of updates by role name, read as it goes, and the per-session stop
  flags and own runs; ``saved``: a saved run kept and reopened;
* ``lab``: what the handlers share; ``events`` (the page's own events), ``running`` (Run live,
  Swap the fact, ``/run``, the sweep), ``walk`` (the lesson's "Show me", the walk-through),
  ``comparing`` (Compare two): the functions that wire the events, one per concern.

Handlers return ``{role: value}`` ("answer:kvcomm", "head:kvcomm", "status", "figure:latency");
``Page.resolve`` maps roles to components, so no handler indexes a list of outputs. A run is read
once (``kvviz.app.reading``) and its reading kept beside its results (the ``reading`` State).
"""
