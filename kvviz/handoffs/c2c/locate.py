"""Which fuser a C2C run reads: the one asked for (C2C's ``fuser`` option, read by its control too),
the pair's shipped one, or the paper's; the fuser loaded for a run, or why it cannot be (``fuser_for``).

Shipped fusers live in ``assets/fusers/<sharer>__<receiver>/c2c`` and ``.../control``
(``kvviz.core.paths.SHIPPED_FUSERS``) and are found by matching the pair's architecture fingerprint
(models, KV shapes, tokenizer hash), whatever the pair's name. A given fuser (the C2C handoff's
``fuser`` option, ``eval-fuser --fuser``) is a checkpoint folder, a folder in the C2C paper's
published layout or a hub path to one (converted once, ``kvviz.handoffs.c2c.reference``); its control sits
beside it. A pair with no shipped fuser for which the paper publishes one uses that one. Local
folders must lie inside the folders fusers may come from (``kvviz.core.policy``).

Also here: the communication measure ``eval-fuser --out <pair folder>/communication.json``
stores beside a fuser pair, which the handoff shows under its answer.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import torch

from kvviz.core import policy
from kvviz.core.paths import SHIPPED_FUSERS
from kvviz.core.results import HandoffRequest
from kvviz.handoffs.c2c import reference
from kvviz.handoffs.c2c.config import CONFIG_FILE, WEIGHTS_FILE, FuserError, is_reference_layout, read_config
from kvviz.handoffs.c2c.fuser import C2CFuser, load_fuser
from kvviz.handoffs.registry import NotApplicable, Option, option_values
from kvviz.runtime import adapters
from kvviz.runtime.checkpoints import checkpoint_label, fingerprints_match, model_fingerprint
from kvviz.runtime.models import LoadedPair

KINDS = ("c2c", "control")

NAME, CONTROL = "c2c", "c2c_control"  # the C2C handoff and its control fuser


def shipped_folder(sharer: str, receiver: str) -> Path:
    """Where the shipped fusers of a (sharer, receiver) pair live."""
    safe = lambda name: name.replace("/", "--")  # noqa: E731
    return SHIPPED_FUSERS / f"{safe(sharer)}__{safe(receiver)}"


def sharer_names(sharer: str) -> list[str]:
    """The sharer names whose shipped fusers this sharer reads first: its own, then, for a sharer
    with an adapter whose card names a ``counterpart`` (the sharer that learned the opposite names
    the one that learned the facts), the counterpart's: C2C with the permuted sharer is the
    fuser trained with the knowing one, reading the other sharer (``kvviz.runtime.adapters``)."""
    base, adapter = adapters.split_name(sharer)
    if adapter is None:
        return [sharer]
    counterpart = adapters.read_card(adapters.adapter_folder(base, adapter)).get("counterpart")
    return [sharer] + ([f"{base}{adapters.SEPARATOR}{counterpart}"] if counterpart else [])


def find_shipped(pair: LoadedPair, kind: str = "c2c", root: Path | None = None) -> Path | None:
    """The shipped fuser of this kind whose fingerprint matches the pair, or None (the sharer's own
    folder first, ``sharer_names``, then every folder in order). A sharer with an adapter takes only
    the fusers trained with it or its counterpart: a fuser of its base model has the same shapes but
    never read what the adapter taught, and would pass for C2C with a sharer that knows."""
    root = SHIPPED_FUSERS if root is None else root
    if not root.is_dir():
        return None
    wanted_s, wanted_r = model_fingerprint(pair.sharer.facts), model_fingerprint(pair.receiver.facts)
    preferred = [shipped_folder(name, pair.receiver.name) / kind for name in sharer_names(pair.sharer.name)]
    studied = adapters.split_name(pair.sharer.name)[1] is not None
    candidates = preferred + ([] if studied else sorted(p / kind for p in root.iterdir() if p.is_dir()))
    for folder in candidates:
        if not (folder / "config.json").is_file():
            continue
        try:
            config = read_config(folder)
        except FuserError:
            continue
        if fingerprints_match(config.sharer, wanted_s) and fingerprints_match(config.receiver, wanted_r):
            return folder
    return None


_fusers: dict[tuple, C2CFuser] = {}
_fusers_lock = threading.Lock()


def get_fuser(folder: Path | str, pair: LoadedPair) -> C2CFuser:
    """Load once per process (keyed by folder, file time and device).

    ``folder`` may also be a fuser in the C2C paper's layout or a hub path to one: it is
    converted once (``kvviz.handoffs.c2c.reference``) and the converted folder is loaded.
    """
    folder = reference.prepare(folder, pair.sharer.facts, pair.receiver.facts, pair.name)
    weights = folder / "fuser.safetensors"
    stamp = weights.stat().st_mtime_ns if weights.exists() else 0
    key = (str(folder.resolve()), stamp, str(pair.receiver.device), pair.sharer.name, pair.receiver.name)
    # the fuser computes in float32 on a CPU; on an accelerator in the receiver's dtype
    dtype = torch.float32 if pair.receiver.device.type == "cpu" else pair.receiver.dtype
    with _fusers_lock:
        if key not in _fusers:
            _fusers[key] = load_fuser(
                folder, pair.sharer.facts, pair.receiver.facts, pair.name, device=pair.receiver.device, dtype=dtype
            )
        return _fusers[key]


def published_fuser(pair: LoadedPair) -> str | None:
    """The paper's published fuser for this pair (a hub path), if the authors publish one."""
    return reference.PUBLISHED_FUSERS.get((pair.sharer.name, pair.receiver.name))


def resolve_fuser(pair: LoadedPair, given: str | None, control: bool) -> tuple[Path | None, str]:
    """(folder, "") or (None, reason) for ``given`` (a fuser folder or hub path; None: the pair's
    shipped one, else the paper's published one). A hub path comes back as a Path of the hub path's text (it is
    fetched into the hub cache). A local folder and its files must lie inside the folders fusers
    may come from (``kvviz.core.policy``: a symlink out of them is refused); for a folder in the paper's
    layout that means every file in it."""
    folder, reason = locate_fuser(pair, given, control)
    if folder is not None and not reference.is_hub_path(str(folder)):
        files: tuple[str, ...] = (CONFIG_FILE, WEIGHTS_FILE)
        if folder.is_dir() and is_reference_layout(folder):
            files += tuple(sorted(p.name for p in folder.iterdir()))
        refusal = policy.fuser_folder_refusal(folder, files)
        if refusal:
            return None, refusal
    return folder, reason


def locate_fuser(pair: LoadedPair, given: str | None, control: bool) -> tuple[Path | None, str]:
    """(folder, "") or (None, reason): the given fuser folder, the pair's shipped one, or the
    paper's published one for the pair (a hub path)."""
    kind = "control" if control else "c2c"
    if given:
        if reference.is_hub_path(given):
            if control:
                return None, f"No control fuser for the published fuser {given}: the paper publishes none."
            return Path(given), ""
        folder = Path(given).expanduser()
        if control:
            # a user checkpoint's control sits beside it: <dir>/c2c and <dir>/control
            sibling = folder.parent / "control"
            if (sibling / "config.json").is_file() and sibling.resolve() != folder.resolve():
                return sibling, ""
            if (folder / "control" / "config.json").is_file():
                return folder / "control", ""
            return None, f"No control fuser beside {folder} (expected {sibling})."
        if (folder / "c2c" / "config.json").is_file() and not (folder / "config.json").is_file():
            folder = folder / "c2c"
        return folder, ""
    found = find_shipped(pair, kind)
    if found is None:
        published = published_fuser(pair)
        if published and not control:
            return Path(published), ""
        if published:
            return None, (
                f"The C2C paper publishes a fuser for pair '{pair.name}' ({published}) but no control fuser. "
                f"Train a control with: python -m kvviz train-fuser --pair {pair.name} --control"
            )
        return None, (
            f"No trained {'control ' if control else ''}C2C fuser for pair '{pair.name}' "
            f"(sharer {pair.sharer.name} -> receiver {pair.receiver.name}) among the shipped fusers "
            "(assets/fusers; a page never shows a server's paths). "
            "Train one with: python -m kvviz train-fuser --pair " + pair.name
        )
    return found, ""


COMMUNICATION_FILE = "communication.json"  # eval-fuser's report, beside a pair's c2c/ and control/


def stored_communication(folder: Path) -> dict | None:
    """The communication measure ``eval-fuser --out <pair folder>/communication.json`` stored
    beside the fuser pair, when it names this fuser (as C2C or as its control); else None."""
    path = Path(folder).parent / COMMUNICATION_FILE
    try:
        report = json.loads(path.read_text())
        label = checkpoint_label(folder)
        if label not in (report.get("fuser"), report.get("control")):
            return None
        heldout = report["heldout"]
        measured = dict(heldout["communication"]["c2c"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    measured["heldout_nll"] = dict(heldout.get("nll", {}))
    measured["data"] = heldout.get("data")
    measured["source"] = checkpoint_label(path)
    if report.get("command"):
        measured["command"] = report["command"]
    return measured


def communication_details(fuser: C2CFuser, folder: Path | None = None) -> dict | None:
    """The C2C fuser's measured communication gain (``eval-fuser``): recorded in the fuser's config
    by the trainer (``--measure``), else stored beside the fuser pair (``COMMUNICATION_FILE``). A
    control column shows its C2C's measure (its own gain is 0 by construction)."""
    measured = (fuser.config.training or {}).get("communication")
    if measured and not fuser.config.control:
        return dict(measured, source="the fuser's config (train-fuser --measure)")
    return stored_communication(folder) if folder is not None and not reference.is_hub_path(str(folder)) else None


def fuser_for(pair: LoadedPair, request: HandoffRequest, control: bool) -> tuple[C2CFuser, object]:
    """(the fuser, its folder); ``NotApplicable`` saying why when none of this kind is found or it
    does not load (a corrupt checkpoint, one made for another pair)."""
    name = CONTROL if control else NAME
    folder, reason = resolve_fuser(pair, fuser_option(request), control)
    if folder is None:
        raise NotApplicable(reason)
    try:
        fuser = get_fuser(folder, pair)
    except FuserError as error:
        raise NotApplicable(str(error)) from error
    if fuser.config.control != control:
        kind = "a control" if fuser.config.control else "a real (non-control)"
        raise NotApplicable(f"The fuser at {folder} is {kind} fuser; {name} needs the other kind.")
    return fuser, folder


def fuser_found(control: bool):
    """Applicable when a fuser of this kind is found for the pair (config files only, no weights)."""

    def check(pair: LoadedPair, request: HandoffRequest) -> str | None:
        folder, reason = resolve_fuser(pair, fuser_option(request), control)
        return reason if folder is None else None

    return check


def refuse_in_public_mode(folder: str) -> None:
    """A public server runs the shipped fusers only (``kvviz.core.policy``)."""
    if folder.strip() and policy.public_mode():
        raise ValueError(policy.PUBLIC_FUSER_REFUSAL)


OPTIONS = (
    Option("fuser", "C2C fuser checkpoint folder (default: the pair's shipped one)", "", kind="text",
           flag="--fuser", on_page=False, check=refuse_in_public_mode),
)


def fuser_option(request: HandoffRequest) -> str | None:
    """The fuser folder the request names (C2C's option, read by its control too), or None."""
    return option_values(request, NAME, OPTIONS)["fuser"].strip() or None
