"""The C2C paper's published fusers: read their layout, convert once to kvviz's form, run them.

The authors publish trained fusers (e.g. ``nics-efc/C2C_Fuser``, folder
``qwen3_0.6b+qwen2.5_0.5b_Fuser/final``) as one folder holding

* ``projector_config.json``: ``{receiver model: {sharer model: {receiver layer: [[sharer layer,
  projector index], ...]}}}`` (JSON object keys are strings);
* ``projector_{i}.json``: ``{"class": "C2CProjector", "init_args": {source_dim, target_dim,
  source_num_heads, target_num_heads, hidden_dim, intermediate_dim, num_layers, dropout, ...}}``;
* ``projector_{i}.pt``: the projector's state dict (``key_in``, ``key_mlp1.blocks.0.{norm,w1,w2}``,
  ``key_proj_mlp2.blocks.*``, ``key_proj_out``, ``key_scalar_mlp2.blocks.0.*``,
  ``key_scalar_head``, the same for ``value_``, and the scalar ``key_gate_logit`` /
  ``value_gate_logit``).

``convert_reference`` reads that (``.pt`` files only with ``torch.load(weights_only=True)``: no
pickled code runs), checks it against the loaded pair, and writes a kvviz fuser folder
(``fuser.safetensors`` + ``config.json``, ``source="reference"``) into the kvviz cache, once; later
calls return the cached folder. The reference architecture is kvviz's projector with biases on
its three linear maps, ``intermediate`` inner width and ``num_layers - 2`` projection blocks.

A hub path (``owner/repo/sub/folder``) is downloaded with ``huggingface_hub.snapshot_download``
(only that sub-folder; ``huggingface_hub`` is imported only then). Without network the error says
how to fetch it by hand.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch

from kvviz.core.paths import cache_dir
from kvviz.handoffs.c2c.config import REFERENCE_CONFIG, FuserConfig, FuserError, is_reference_layout
from kvviz.handoffs.c2c.fuser import C2CFuser, build_from_tensors
from kvviz.runtime.checkpoints import model_fingerprint

SUPPORTED_CLASSES = ("C2CProjector",)

# (sharer, receiver) -> the paper's published fuser for that pair, as a hub path
PUBLISHED_FUSERS = {
    ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen3-0.6B"): "nics-efc/C2C_Fuser/qwen3_0.6b+qwen2.5_0.5b_Fuser/final",
}


def is_hub_path(text: str) -> bool:
    """``owner/repo/sub/...`` that is not a local path."""
    if not text or Path(text).expanduser().exists() or text.startswith(("/", ".", "~")):
        return False
    parts = [p for p in text.split("/") if p]
    return len(parts) >= 3


def fetch_from_hub(path: str) -> Path:
    """Download one sub-folder of a hub repository (``owner/repo/sub/...``); the local folder."""
    parts = [p for p in path.split("/") if p]
    repo_id, sub = "/".join(parts[:2]), "/".join(parts[2:])
    how = (
        f"Fetch it where the hub is reachable with: huggingface-cli download {repo_id} --include '{sub}/*' "
        f"--local-dir DIR, then pass --fuser DIR/{sub}"
    )
    try:
        from huggingface_hub import snapshot_download

        local = snapshot_download(repo_id=repo_id, allow_patterns=[f"{sub}/*"])
    except Exception as error:  # offline, unknown repo, no permission: all say the same to the user
        raise FuserError(f"Could not get the published fuser {path} from the Hugging Face hub ({type(error).__name__}). {how}") from error
    folder = Path(local) / sub
    if not is_reference_layout(folder):
        raise FuserError(f"The hub folder {path} holds no fuser in the C2C layout ({REFERENCE_CONFIG} + projector_*.pt). {how}")
    return folder


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise FuserError(f"{path} is not valid JSON: {error}") from error


def layer_assignments(folder: Path, receiver_layers: int, sharer_layers: int) -> tuple[list[int], list[int]]:
    """(layer_map, projector index per receiver layer; -1 where a layer has none)."""
    data = _read_json(folder / REFERENCE_CONFIG)
    try:
        targets = data["0"] if "0" in data else next(iter(data.values()))
        if len(targets) != 1:
            raise FuserError(f"{folder / REFERENCE_CONFIG} fuses {len(targets)} sharers; kvviz runs one sharer.")
        entries = next(iter(targets.values()))
        layer_map, projector = [-1] * receiver_layers, [-1] * receiver_layers
        for target, pairs in entries.items():
            target = int(target)
            source, index = int(pairs[0][0]), int(pairs[0][1])
            if not 0 <= target < receiver_layers or not 0 <= source < sharer_layers:
                raise FuserError(
                    f"{folder / REFERENCE_CONFIG} maps receiver layer {target} to sharer layer {source}, outside the "
                    f"loaded pair ({receiver_layers} receiver, {sharer_layers} sharer layers): a fuser for another pair?"
                )
            layer_map[target], projector[target] = source, index
    except FuserError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, StopIteration, AttributeError) as error:
        raise FuserError(f"{folder / REFERENCE_CONFIG} is not a C2C projector config: {error}") from error
    if all(p < 0 for p in projector):
        raise FuserError(f"{folder / REFERENCE_CONFIG} assigns no projector to any receiver layer.")
    return layer_map, projector


def projector_args(folder: Path, index: int) -> dict:
    path = folder / f"projector_{index}.json"
    if not path.is_file():
        raise FuserError(f"The reference fuser at {folder} has no {path.name}.")
    data = _read_json(path)
    cls = data.get("class") if isinstance(data, dict) else None
    if cls not in SUPPORTED_CLASSES:
        raise FuserError(f"{path} describes a {cls!r} projector; kvviz converts {', '.join(SUPPORTED_CLASSES)}.")
    args = dict(data.get("init_args") or {})
    for name in ("source_dim", "target_dim", "source_num_heads", "target_num_heads"):
        if name not in args:
            raise FuserError(f"{path} lacks init_args.{name}.")
    args.setdefault("hidden_dim", 1024)
    args.setdefault("intermediate_dim", 1024)
    args.setdefault("num_layers", 3)
    args.setdefault("dropout", 0.1)
    if int(args["num_layers"]) < 3:
        raise FuserError(f"{path}: a C2CProjector has num_layers >= 3, not {args['num_layers']}.")
    return args


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A projector_{i}.pt state dict, read with weights_only=True (never runs pickled code)."""
    if not path.is_file():
        raise FuserError(f"The reference fuser has no {path.name} at {path.parent}.")
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as error:  # corrupt file, or a pickle that weights_only refuses
        raise FuserError(f"{path} is corrupt or not a plain state dict (read with weights_only=True): {error}") from error
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise FuserError(f"{path} does not hold a state dict of tensors.")
    return state


def _block_names(prefix: str, target: str) -> dict[str, str]:
    return {f"{prefix}.norm.weight": f"{target}.norm.weight", f"{prefix}.w1.weight": f"{target}.up.weight", f"{prefix}.w2.weight": f"{target}.down.weight"}


def rename(state: dict[str, torch.Tensor], layer: int, proj_blocks: int) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Reference names of one projector -> kvviz names for receiver layer ``layer``; the gate logits apart."""
    names: dict[str, str] = {}
    for side, kvviz_side in (("key", "key_projectors"), ("value", "value_projectors")):
        base = f"{kvviz_side}.{layer}"
        names.update({
            f"{side}_in.weight": f"{base}.inp.weight",
            f"{side}_in.bias": f"{base}.inp.bias",
            f"{side}_proj_out.weight": f"{base}.proj_out.weight",
            f"{side}_proj_out.bias": f"{base}.proj_out.bias",
            f"{side}_scalar_head.weight": f"{base}.weight_out.weight",
            f"{side}_scalar_head.bias": f"{base}.weight_out.bias",
        })
        names.update(_block_names(f"{side}_mlp1.blocks.0", f"{base}.trunk"))
        names.update(_block_names(f"{side}_scalar_mlp2.blocks.0", f"{base}.weight_block"))
        names.update(_block_names(f"{side}_proj_mlp2.blocks.0", f"{base}.proj_block"))
        for k in range(1, proj_blocks):
            names.update(_block_names(f"{side}_proj_mlp2.blocks.{k}", f"{base}.proj_extra.{k - 1}"))
    gate_names = {"key_gate_logit", "value_gate_logit"}
    missing = sorted(set(names) - set(state)) + sorted(gate_names - set(state))
    if missing:
        raise FuserError(f"the reference projector lacks {missing[0]} ({len(missing)} names missing)")
    unexpected = sorted(set(state) - set(names) - gate_names - {"gate_temperature"})
    if unexpected:
        raise FuserError(
            f"the reference projector has parameters kvviz does not know (e.g. {unexpected[0]}): "
            f"not a C2CProjector with num_layers={proj_blocks + 2}?"
        )
    gates = {}
    for side in ("key", "value"):
        logit = state[f"{side}_gate_logit"]
        if logit.numel() != 1:
            raise FuserError(f"the reference projector's {side}_gate_logit is not a scalar")
        gates[side] = float(logit.float())
    return {new: state[old] for old, new in names.items()}, gates


def _fingerprint_source(folder: Path, sharer: dict, receiver: dict) -> str:
    digest = hashlib.sha256()
    digest.update(str(folder.resolve()).encode())
    for path in sorted(folder.iterdir()):
        if path.name == REFERENCE_CONFIG or path.name.startswith("projector_"):
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    digest.update(json.dumps([sharer, receiver], sort_keys=True).encode())
    return digest.hexdigest()[:16]


def converted_root() -> Path:
    return cache_dir() / "fusers" / "reference"


def shared_projector_args(folder: Path, used: list[int], sharer: dict, receiver: dict, pair_name: str) -> dict:
    """The projectors' init_args, checked: one shape for every layer, and this pair's KV shapes."""
    args = {index: projector_args(folder, index) for index in used}
    first = args[used[0]]
    for index, a in args.items():
        if any(a[k] != first[k] for k in ("source_dim", "target_dim", "source_num_heads", "target_num_heads", "hidden_dim", "intermediate_dim", "num_layers")):
            raise FuserError(f"projector_{index}.json differs in shape from projector_{used[0]}.json; kvviz needs one shape for all layers.")
    wanted = {
        "source_dim": sharer["head_dim"], "source_num_heads": sharer["num_kv_heads"],
        "target_dim": receiver["head_dim"], "target_num_heads": receiver["num_kv_heads"],
    }
    differ = [f"{k} {first[k]} != {v}" for k, v in wanted.items() if int(first[k]) != int(v)]
    if differ:
        raise FuserError(
            f"The reference fuser at {folder} does not fit pair '{pair_name or '?'}' (sharer {sharer['name']} -> receiver "
            f"{receiver['name']}): {'; '.join(differ)}. It was trained for another pair."
        )
    return first


def reference_config(folder: Path, sharer: dict, receiver: dict, pair_name: str, layer_map: list[int], projector: list[int],
                     first: dict, hub_path: str) -> FuserConfig:
    """kvviz's config for the paper's architecture: biases, its inner width, num_layers - 2 projection blocks."""
    return FuserConfig(
        sharer=sharer,
        receiver=receiver,
        width=int(first["hidden_dim"]),
        dropout=float(first["dropout"]),
        pair=pair_name,
        control=False,
        layer_map=layer_map,
        bias=True,
        intermediate=int(first["intermediate_dim"]),
        proj_blocks=int(first["num_layers"]) - 2,
        rope="plain",
        fuse="kv",
        source="reference",
        reference={
            "folder": str(folder.resolve()),
            "hub": hub_path,
            "class": "C2CProjector",
            "projectors": {str(layer): index for layer, index in enumerate(projector) if index >= 0},
            "init_args": {k: v for k, v in first.items() if isinstance(v, (int, float, str, bool))},
        },
        training={
            "data": "the paper's (OpenHermes-2.5); see the hub model card",
            "receiver_sees_context": True,  # trained with both models reading the same input
            "context": "shared",
        },
    )


def reference_tensors(folder: Path, config: FuserConfig, projector: list[int], used: list[int]) -> tuple[dict, torch.dtype]:
    """Every projector's weights under kvviz's names (zeros for layers without one) and the gate
    logits; (tensors, the stored dtype)."""
    tensors: dict[str, torch.Tensor] = {}
    gate_logits = torch.zeros(config.receiver["num_layers"], 2)
    states = {index: read_state_dict(folder / f"projector_{index}.pt") for index in used}
    dtype = next(iter(states[used[0]].values())).dtype
    for layer in range(config.receiver["num_layers"]):
        index = projector[layer]
        if index < 0:
            continue
        try:
            renamed, gates = rename(states[index], layer, config.proj_blocks)
        except FuserError as error:
            raise FuserError(f"projector_{index}.pt: {error}") from error
        tensors.update(renamed)
        gate_logits[layer, 0], gate_logits[layer, 1] = gates["key"], gates["value"]
    # layers without a projector stay unfused (layer_map -1): zero weights keep the file complete
    with torch.device("meta"):
        shapes = {name: tuple(t.shape) for name, t in C2CFuser(config).state_dict().items()}
    for name, shape in shapes.items():
        if name not in tensors and name != "gate_logits":
            layer = int(name.split(".")[1])
            if projector[layer] < 0:
                tensors[name] = torch.zeros(shape, dtype=dtype)
    tensors = {name: t.to(dtype) for name, t in tensors.items()}
    tensors["gate_logits"] = gate_logits
    return tensors, dtype


def convert_reference(folder, sharer_facts, receiver_facts, pair_name: str = "", out: Path | None = None, hub_path: str = "") -> Path:
    """Convert a reference-layout folder for this pair (once; cached). Returns the kvviz folder."""
    folder = Path(folder)
    if not is_reference_layout(folder):
        raise FuserError(f"{folder} is not a fuser in the C2C paper's layout ({REFERENCE_CONFIG} + projector_*.pt).")
    sharer, receiver = model_fingerprint(sharer_facts), model_fingerprint(receiver_facts)
    target = Path(out) if out is not None else converted_root() / _fingerprint_source(folder, sharer, receiver)
    if (target / "config.json").is_file() and (target / "fuser.safetensors").is_file():
        return target
    layer_map, projector = layer_assignments(folder, receiver["num_layers"], sharer["num_layers"])
    used = sorted({p for p in projector if p >= 0})
    first = shared_projector_args(folder, used, sharer, receiver, pair_name)
    config = reference_config(folder, sharer, receiver, pair_name, layer_map, projector, first, hub_path)
    tensors, dtype = reference_tensors(folder, config, projector, used)
    fuser = build_from_tensors(config, tensors, folder, dtype=None)  # raises when the weights do not fit the shapes
    tmp = target.with_name(target.name + ".tmp")
    fuser.save(tmp, dtype=dtype)
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def prepare(source: str | Path, sharer_facts, receiver_facts, pair_name: str = "") -> Path:
    """A kvviz fuser folder for ``source``: a kvviz folder as is; a reference folder or hub path converted."""
    text = str(source)
    if is_hub_path(text):
        folder = fetch_from_hub(text)
        return convert_reference(folder, sharer_facts, receiver_facts, pair_name, hub_path=text)
    folder = Path(text).expanduser()
    if folder.is_dir() and not (folder / "config.json").is_file() and is_reference_layout(folder):
        return convert_reference(folder, sharer_facts, receiver_facts, pair_name)
    return folder
