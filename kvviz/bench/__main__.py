"""``python -m kvviz.bench ...``: the same as ``python -m kvviz bench ...``."""

import argparse

from kvviz.bench import configure_parser, main

parser = argparse.ArgumentParser(prog="python -m kvviz.bench")
configure_parser(parser)
raise SystemExit(main(parser.parse_args()))
