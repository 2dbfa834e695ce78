"""kvviz lab: `python app.py` serves the page on 127.0.0.1:7860 (see --help for flags).

Thin by design: the page lives in kvviz/ui.py, the figures in kvviz/plots.py.
"""

from __future__ import annotations

import argparse
import os
import threading


def _preload(pair: str) -> None:
    """Load the pair in the background so the first live run does not wait for it."""
    try:
        from kvviz.engine import load_pair

        load_pair(pair, progress=lambda message: print(message, flush=True))
    except Exception as error:  # the page still works (precomputed results); a run will show the error
        print(f"kvviz: could not preload the pair '{pair}': {error}", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="kvviz: watch two language models talk (Gradio app)")
    # Hugging Face Spaces set GRADIO_SERVER_NAME=0.0.0.0; locally the page stays on 127.0.0.1.
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"), help="default 127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")), help="default 7860")
    parser.add_argument("--pair", default="embedded", help="the pair selected when the page opens")
    parser.add_argument("--no-preload", action="store_true", help="load models on the first run, not at start")
    parser.add_argument("--share", action="store_true", help="ask Gradio for a public share link")
    args = parser.parse_args(argv)

    from kvviz.stream import use_one_thread_per_handoff
    from kvviz.ui import build_demo, launch_kwargs

    use_one_thread_per_handoff()
    demo = build_demo(default_pair=args.pair)
    if not args.no_preload:
        threading.Thread(target=_preload, args=(args.pair,), daemon=True, name="kvviz-preload").start()
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, **launch_kwargs())


if __name__ == "__main__":
    main()
