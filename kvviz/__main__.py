from kvviz.cli import main

raise SystemExit(main())
