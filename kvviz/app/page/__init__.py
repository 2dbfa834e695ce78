"""The lab's page, in small pieces (``kvviz.app.ui.build_demo`` puts them together).

* ``spec``: what the page shows, read from the registry and the presets (columns, tabs, figures,
  options, the walk-through): no Gradio;
* ``theme``: CSS and the theme (every text at least 4.5:1);
* ``views``: the values the page shows for a run's results (cards, verdict strip, status lines,
  the figures of one tab, cached per precomputed preset): no Gradio;
* ``run``: a live run as a stream of updates by role name, and the per-session stop flags;
* ``layout``: the ``Page`` of named components and the functions that build it;
* ``events``: the functions that wire the page's events, one per concern.

Handlers return ``{role: value}`` ("answer:kvcomm", "mark:kvcomm", "status", "figure:latency");
``Page.resolve`` maps roles to components, so no handler indexes a list of outputs.
"""
