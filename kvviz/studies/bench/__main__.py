"""``python -m kvviz.studies.bench ...``: the same as ``python -m kvviz bench ...``."""

import argparse

from kvviz.studies.bench import configure_parser, main

parser = argparse.ArgumentParser(prog="python -m kvviz.studies.bench")
configure_parser(parser)
raise SystemExit(main(parser.parse_args()))
