"""kvviz lab: `python app.py` serves the page on 127.0.0.1:7860 (see --help for flags).

Thin by design: the page lives in kvviz/app/ui.py, the figures in kvviz/app/plots.py. The same file is a
Hugging Face Space's app (`python -m kvviz space export DIR`).
"""

from __future__ import annotations

import argparse
import os
import threading

# First, before anything imports torch: on a ZeroGPU Space the `spaces` package must be imported
# before CUDA is touched (kvviz.core.zerogpu imports it where it is installed, and no torch).
from kvviz.core import zerogpu


SPACE_PROXIES = "127.0.0.1,::1,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16"


def _preload(pair: str) -> None:
    """Load the pair in the background so the first live run does not wait for it."""
    try:
        from kvviz.engine.runner import load_pair

        load_pair(pair, progress=lambda message: print(message, flush=True))
    except Exception as error:  # the page still works (precomputed results); a run will show the error
        print(f"kvviz: could not preload the pair '{pair}': {error}", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="kvviz: watch two language models talk (Gradio app)")
    # Hugging Face Spaces set GRADIO_SERVER_NAME=0.0.0.0; locally the page stays on 127.0.0.1.
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"), help="default 127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")), help="default 7860")
    parser.add_argument("--pair", default="embedded", help="the pair selected when the page opens")
    parser.add_argument("--device", default=None,
                        help="cpu, cuda, cuda:N, or auto (spread each model over every GPU); default: CUDA where available")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: bf16 on GPU, fp32 on CPU)")
    parser.add_argument("--no-preload", action="store_true", help="load models on the first run, not at start")
    parser.add_argument("--share", action="store_true", help="ask Gradio for a public share link")
    parser.add_argument("--public", action="store_true",
                        help="public mode (on by itself on a Hugging Face Space): registered pairs only, smaller caps")
    args = parser.parse_args(argv)
    # every model the page loads (kvviz.runtime.models.default_device / parse_dtype) follows these
    if args.device:
        os.environ["KVVIZ_DEVICE"] = args.device
    if args.dtype:
        os.environ["KVVIZ_DTYPE"] = args.dtype
    if zerogpu.on_zerogpu():  # each run goes to a GPU worker of its own: runs at once share no decode step
        os.environ.setdefault("KVVIZ_CONCURRENCY", "1")
    if os.environ.get("SPACE_ID"):  # a Space is reached through its proxy, on the private network: the workshop's
        os.environ.setdefault("FORWARDED_ALLOW_IPS", SPACE_PROXIES)  # allowances count the address it forwards

    from kvviz.app.ui import build_demo, launch_kwargs
    from kvviz.app.workshop import api as workshop
    from kvviz.app.workshop import joining
    from kvviz.core import policy
    from kvviz.engine import run_processes
    from kvviz.engine.stream import use_one_thread_per_handoff

    if args.public:
        policy.set_public_mode()

    use_one_thread_per_handoff()
    # On a CPU the live runs are computed in worker processes: threads of one process on two cores
    # spend about half their CPU handing the interpreter lock across cores (docs/SPEED.md 13.9).
    processes = run_processes.default_count()
    workers = run_processes.RunProcesses(processes) if processes else None
    if processes:  # more runs at once share each worker's decode steps (measured: kvviz.core.policy)
        os.environ.setdefault("KVVIZ_CONCURRENCY", str(policy.RUNS_PER_WORKER_PROCESS * processes))
    demo = build_demo(default_pair=args.pair, compute=None if workers is None else workers.run)
    if zerogpu.on_zerogpu():
        # ZeroGPU: the models go to CUDA now, on the main thread, where the `spaces` package
        # intercepts `.to("cuda")`; each @spaces.GPU call then finds them on its GPU.
        _preload(args.pair)
    elif not args.no_preload:
        if workers is not None:  # each worker loads the pair; this process loads it only for a sweep
            workers.warm(args.pair)
        else:
            threading.Thread(target=_preload, args=(args.pair,), daemon=True, name="kvviz-preload").start()
    mode = "public mode" if policy.public_mode() else "local mode"
    runs = policy.model_concurrency()
    computed = f"in {processes} worker processes" if processes else "in this process"
    print(f"kvviz: {mode}, {runs} run(s) at once ({computed}), queue of {policy.caps().queue_size}", flush=True)
    classes = workshop.Service(listen_host=args.host)
    print(f"kvviz: workshop at http://{args.host}:{args.port}/workshop (store: {classes.store_label})", flush=True)
    if joining.is_loopback(args.host):
        print("kvviz: phones cannot reach this address; for a class, serve on the network: python app.py --host 0.0.0.0",
              flush=True)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share,
                app_kwargs=workshop.launch_app_kwargs(classes), **launch_kwargs())


if __name__ == "__main__":
    main()
