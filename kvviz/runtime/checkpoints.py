"""A checkpoint trained for one pair of models (a C2C fuser, a KV translator): the fingerprint of
the models it fits, what differs from a loaded pair, its weights read without unpickling, and its
label in results.

Both kinds of checkpoint are a folder with safetensors weights and a JSON config that holds the
fingerprints of the sharer and the receiver it was trained for.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvviz.core.paths import project_label


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt, inconsistent or made for another pair."""


# what must match for a checkpoint to fit a model: architecture, KV shape, tokenizer (not the name)
_FINGERPRINT_KEYS = ("model_type", "num_layers", "num_kv_heads", "head_dim", "tokenizer_hash")


def model_fingerprint(facts) -> dict:
    """What must match for a checkpoint to fit a model: architecture, KV shape, tokenizer (and the
    model's name, for messages)."""
    return {
        "name": facts.name,
        "model_type": facts.model_type,
        "num_layers": facts.num_layers,
        "num_kv_heads": facts.num_kv_heads,
        "head_dim": facts.head_dim,
        "tokenizer_hash": facts.tokenizer_hash,
    }


def fingerprints_match(expected: dict, actual: dict) -> bool:
    return all(expected.get(key) == actual.get(key) for key in _FINGERPRINT_KEYS)


def pair_differences(saved_sharer: dict, saved_receiver: dict, sharer_facts, receiver_facts) -> list[str]:
    """What differs between the pair a checkpoint was made for and the loaded pair, as
    "role key saved != loaded" lines; empty when the fingerprints match."""
    wanted_s, wanted_r = model_fingerprint(sharer_facts), model_fingerprint(receiver_facts)
    if fingerprints_match(saved_sharer, wanted_s) and fingerprints_match(saved_receiver, wanted_r):
        return []
    differ = [
        f"{role} {key} {saved.get(key)!r} != {wanted.get(key)!r}"
        for role, saved, wanted in (("sharer", saved_sharer, wanted_s), ("receiver", saved_receiver, wanted_r))
        for key in _FINGERPRINT_KEYS
        if saved.get(key) != wanted.get(key)
    ]
    return differ or ["their fingerprints"]


def check_pair(kind: str, config, folder, sharer_facts, receiver_facts, pair_name: str, error: type[CheckpointError],
               remedy: str) -> None:
    """Raise ``error`` naming both pairs when a checkpoint (a ``kind``: "fuser", "translator") was made
    for another pair than the loaded one; ``config`` holds the fingerprints it was made for
    (``sharer``, ``receiver``) and the pair's name (``pair``); ``remedy`` says what to do."""
    differ = pair_differences(config.sharer, config.receiver, sharer_facts, receiver_facts)
    if not differ:
        return
    made_for = f"'{config.pair or '?'}' (sharer {config.sharer['name']} -> receiver {config.receiver['name']})"
    raise error(
        f"The {kind} at {folder} was trained for pair {made_for}, but the loaded pair is '{pair_name or '?'}' "
        f"(sharer {sharer_facts.name} -> receiver {receiver_facts.name}); their models, KV shapes or tokenizers "
        f"differ in: {'; '.join(differ[:3])}. {remedy}"
    )


def read_config_json(folder: str | Path, name: str, kind: str, error: type[CheckpointError], versions: tuple,
                     accepts=None, absent: str = "", train: str = "") -> dict:
    """The JSON object of ``folder/name`` (a checkpoint's config), or ``error`` saying in words what is
    wrong: the file is missing (``absent`` then says what else the folder might hold), not JSON, not an
    object, not what ``accepts(data)`` takes (it returns a message, or "" for a config it reads), or
    of a format version this kvviz does not read (``versions``; ``train``: the command that trains one)."""
    folder = Path(folder)
    path = folder / name
    if not path.is_file():
        raise error(absent or f"No {kind} at {folder}: {name} is missing.")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as failure:
        raise error(f"The {kind} config {path} is not valid JSON: {failure}") from failure
    if not isinstance(data, dict):
        raise error(f"The {kind} config {path} is not a JSON object.")
    refused = accepts(data) if accepts is not None else ""
    if refused:
        raise error(f"{path}: {refused}")
    version = data.get("version", 1)
    if version not in versions:
        raise error(f"The {kind} config {path} has format version {version}; this kvviz reads versions "
                    f"{', '.join(map(str, versions))}. Update kvviz, or train it again"
                    + (f" with: {train}" if train else "") + ".")
    return data


def config_from(make, data: dict, path: Path, kind: str, error: type[CheckpointError]):
    """``make(**data)`` (a checkpoint's config dataclass, whose ``__post_init__`` or properties may
    read its fields), or ``error`` saying the config at ``path`` is incomplete or has unknown fields."""
    try:
        return make(**data)
    except (TypeError, KeyError) as failure:
        raise error(f"The {kind} config {path} is incomplete or has unknown fields: {failure}") from failure


def read_weights(folder: Path, name: str, kind: str, error: type[CheckpointError]) -> dict:
    """The tensors of ``folder/name`` (safetensors, on the CPU; never unpickled), or ``error``
    saying in words that the file is missing or corrupt (``kind``: "fuser", "translator")."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(folder) / name
    if not path.is_file():
        raise error(f"The {kind} at {folder} has no weights file {name}.")
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as failure:
        raise error(f"The {kind} weights {path} are corrupt or not a safetensors file: {failure}") from failure


def checkpoint_label(folder: str | Path) -> str:
    """A checkpoint's path for results and reports (``kvviz.core.paths.project_label``)."""
    return project_label(folder)
