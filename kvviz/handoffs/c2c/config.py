"""A C2C fuser's checkpoint format: its config (``FuserConfig``: the pair's fingerprints, the
architecture and its variants, how it was trained), the files of a fuser folder, and reading a
config with a clear error for every way it can be wrong (``read_config``, ``check_pair``).

A fuser folder holds ``fuser.safetensors`` (weights, fp32 or fp16) and ``config.json``. Loading never
unpickles. Format 2 added the architecture variants; format-1 checkpoints load unchanged. A folder
in the C2C paper's published layout (``projector_config.json`` and ``projector_N.pt``) is recognised
here and converted by ``kvviz.handoffs.c2c.reference``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvviz.handoffs.c2c.align import TOKEN_ALIGNMENTS, terminal_layer_map
from kvviz.runtime import checkpoints
from kvviz.runtime.checkpoints import CheckpointError

WEIGHTS_FILE = "fuser.safetensors"
CONFIG_FILE = "config.json"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
ROPE_MODES = ("plain", "aware")
FUSE_MODES = ("kv", "k", "v")


class FuserError(CheckpointError):
    """A fuser checkpoint is missing, corrupt, inconsistent or made for another pair."""


@dataclass
class FuserConfig:
    sharer: dict  # model_fingerprint of the sharer
    receiver: dict  # model_fingerprint of the receiver
    width: int = 96
    dropout: float = 0.1
    pair: str = ""
    control: bool = False  # trained with the sharer's KV replaced by zeros
    layer_map: list[int] = field(default_factory=list)
    training: dict = field(default_factory=dict)
    version: int = FORMAT_VERSION
    # format 2: architecture variants (the defaults are format 1's architecture)
    bias: bool = False
    intermediate: int | None = None  # inner width of the trunk and projection blocks (None: width)
    proj_blocks: int = 1
    rope: str = "plain"
    fuse: str = "kv"
    token_alignment: str = "longest"  # kvviz.handoffs.c2c.align: "longest" (the paper) or "natural"
    fuse_template: bool = False  # also fuse the template tokens before the last prompt token (kvviz.handoffs.c2c.align)
    source: str = "kvviz"  # "kvviz" (trained here) or "reference" (converted from the paper's layout)
    reference: dict = field(default_factory=dict)  # where a converted fuser came from

    def __post_init__(self):
        if not self.layer_map:
            self.layer_map = terminal_layer_map(self.sharer["num_layers"], self.receiver["num_layers"])
        if self.rope not in ROPE_MODES:
            raise FuserError(f"Unknown rope mode {self.rope!r}; choose from {', '.join(ROPE_MODES)}.")
        if self.fuse not in FUSE_MODES:
            raise FuserError(f"Unknown fuse mode {self.fuse!r}; choose from {', '.join(FUSE_MODES)}.")
        if self.token_alignment not in TOKEN_ALIGNMENTS:
            raise FuserError(f"Unknown token alignment {self.token_alignment!r}; choose from {', '.join(TOKEN_ALIGNMENTS)}.")
        if self.proj_blocks < 1:
            raise FuserError("proj_blocks must be at least 1")
        if len(self.layer_map) != self.receiver["num_layers"]:
            raise FuserError(f"layer_map has {len(self.layer_map)} entries for {self.receiver['num_layers']} receiver layers")
        if any(not -1 <= s < self.sharer["num_layers"] for s in self.layer_map):
            raise FuserError(f"layer_map names a sharer layer outside 0..{self.sharer['num_layers'] - 1}")

    @property
    def sharer_width(self) -> int:
        return self.sharer["num_kv_heads"] * self.sharer["head_dim"]

    @property
    def receiver_width(self) -> int:
        return self.receiver["num_kv_heads"] * self.receiver["head_dim"]

    @property
    def inner_width(self) -> int:
        return self.intermediate or self.width

    def to_dict(self) -> dict:
        return asdict(self)


# The paper's published layout (kvviz.handoffs.c2c.reference converts it): a projector config and weights.
REFERENCE_CONFIG = "projector_config.json"
PROJECTOR_WEIGHTS = re.compile(r"^projector_(\d+)\.pt$")


def is_reference_layout(folder) -> bool:
    """Whether ``folder`` holds a fuser in the C2C paper's layout (``kvviz.handoffs.c2c.reference``)."""
    folder = Path(folder)
    return (folder / REFERENCE_CONFIG).is_file() and any(PROJECTOR_WEIGHTS.match(p.name) for p in folder.iterdir())


def read_config(folder: str | Path) -> FuserConfig:
    folder = Path(folder)
    absent = (f"{folder} holds a fuser in the C2C paper's layout (projector_*.pt); convert it with "
              "kvviz.handoffs.c2c.reference.convert_reference (the handoff and --fuser do this by themselves)."
              if not (folder / CONFIG_FILE).is_file() and is_reference_layout(folder) else
              f"No fuser at {folder}: {CONFIG_FILE} is missing (a fuser folder holds {CONFIG_FILE} and {WEIGHTS_FILE}).")
    data = checkpoints.read_config_json(folder, CONFIG_FILE, "fuser", FuserError, READABLE_VERSIONS, absent=absent,
                                        train="python -m kvviz train-fuser")
    return checkpoints.config_from(_checked_config, data, folder / CONFIG_FILE, "fuser", FuserError)


def _checked_config(**data) -> FuserConfig:
    """A FuserConfig whose model facts it needs are all there (a KeyError names the missing one)."""
    config = FuserConfig(**data)
    _ = (config.sharer_width, config.receiver_width, config.receiver["num_layers"], config.sharer["num_layers"])
    return config


def check_pair(config: FuserConfig, folder, sharer_facts, receiver_facts, pair_name: str = "") -> None:
    """Raise FuserError naming both pairs when a fuser was made for another pair."""
    checkpoints.check_pair("fuser", config, folder, sharer_facts, receiver_facts, pair_name, FuserError,
                           "Train a fuser for this pair with: python -m kvviz train-fuser")
