"""``python -m kvviz``: the command line (``kvviz.cli``)."""

from kvviz.cli import main

raise SystemExit(main())
