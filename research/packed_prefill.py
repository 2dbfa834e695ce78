"""Would the prompt passes gain from the decode step's packed weights (issue 32)?

    PYTHONPATH=. python research/packed_prefill.py [--lengths 16,54] [--repeats 7]

The decode step (``kvviz.runtime.step``) multiplies through oneDNN with its weights packed once,
which is much faster than MKL's ``F.linear`` for a few rows. A prompt pass runs the model's own
forward (MKL) on as many rows as the prompt has tokens. Here each of the embedded models reads a
prompt of each length through its own forward, then with every linear layer of its decoder stack
replaced by a packed oneDNN product (a copy of its weights, packed), alternately, one torch thread:
the median time of each and their ratio, the largest difference in the last position's logits and
whether the greedy token is the same. (The page's prompts are 15 to 54 tokens long.)
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


class PackedLinear(torch.nn.Module):
    """A linear layer whose product runs through oneDNN on a packed copy of its weight."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.linear = linear
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x):
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def use_packed(model, packed: bool) -> None:
    """Swap the decoder stack's linear layers for packed ones (or back); the output head stays."""
    for module in list(model.model.modules()):
        for name, child in list(module.named_children()):
            if packed and isinstance(child, torch.nn.Linear):
                setattr(module, name, PackedLinear(child))
            elif not packed and isinstance(child, PackedLinear):
                setattr(module, name, child.linear)


def timed(model, ids, repeats: int):
    times = []
    with torch.inference_mode():
        for _ in range(repeats):
            started = time.perf_counter()
            logits = model(input_ids=ids, use_cache=True, logits_to_keep=1).logits[0, -1]
            times.append(time.perf_counter() - started)
    return statistics.median(times), logits


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="16,54")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from kvviz.engine.runner import load_pair

    pair = load_pair("embedded", "cpu", "float32", progress=lambda *a: None)
    print("| model | prompt tokens | own forward (MKL) ms | packed oneDNN ms | packed / own | largest logit difference | same greedy token |")
    print("|---|---|---|---|---|---|---|")
    for loaded in (pair.receiver, pair.sharer):
        generator = torch.Generator().manual_seed(0)
        for length in (int(n) for n in args.lengths.split(",")):
            ids = torch.randint(100, 5000, (1, length), generator=generator)
            runs = {False: [], True: []}
            for packed in (False, True, False, True):  # alternated: the machine's load falls on both
                use_packed(loaded.model, packed)
                runs[packed].append(timed(loaded.model, ids, args.repeats))
            use_packed(loaded.model, False)
            own = statistics.median(seconds for seconds, _ in runs[False])
            fast = statistics.median(seconds for seconds, _ in runs[True])
            a, b = runs[False][-1][1], runs[True][-1][1]
            print(f"| {loaded.name} | {length} | {own * 1000:.1f} | {fast * 1000:.1f} | {fast / own:.2f} | "
                  f"{(a - b).abs().max().item():.1e} | {bool(a.argmax() == b.argmax())} |")


if __name__ == "__main__":
    main()
