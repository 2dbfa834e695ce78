"""The latent relay's sender thinking: the alignment map from its last hidden state back to input
embeddings (computed, identity or random: the controls), the latent steps it adds to its cache after
the context, their nearest tokens, and where the receiver's question looks (attention mass)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from kvviz.runtime import cache as kv
from kvviz.runtime.decode import forward_kwargs, prefill, prefill_vectors
from kvviz.runtime.measure import StageTimer
from kvviz.runtime.models import LoadedModel, LoadedPair

CONTROLS = ("off", "no_transfer", "identity_map", "random_map")


RIDGE = 1e-5  # the reference code's regulariser of W_out^T W_out


NEAREST = 3  # nearest tokens reported per latent step


@dataclass(frozen=True)
class AlignmentMap:
    kind: str  # "computed", "identity" or "random"
    matrix: torch.Tensor  # [d, d] float32: a latent vector is (h @ matrix) rescaled to target_norm
    target_norm: float  # mean norm of the input embeddings, at the embedding layer's scale
    seconds: float  # to compute it (once per model; the random map adds its own SVD)
    distance_from_identity: float  # || M - c I ||_F / || M ||_F with c = trace(M) / d

    def apply(self, hidden: torch.Tensor) -> tuple[torch.Tensor, float]:
        """The latent vector for a final hidden state ``[d]``, and the norm of ``h M`` before rescaling."""
        aligned = hidden.float() @ self.matrix.to(hidden.device)
        norm = float(aligned.norm())
        return aligned * (self.target_norm / max(norm, 1e-6)), norm


_maps: dict[tuple, AlignmentMap] = {}
_row_norms: dict[str, torch.Tensor] = {}
_maps_lock = threading.Lock()


def _input_embeddings(model: LoadedModel) -> tuple[torch.Tensor, float]:
    embedding = model.model.get_input_embeddings()
    return embedding.weight, float(getattr(embedding, "embed_scale", 1.0))


def _distance_from_identity(matrix: torch.Tensor) -> float:
    """How far ``matrix`` is from the nearest multiple of the identity, c I (c = trace / d, the
    least-squares best), relative to its own size: 0 for a scaled identity, about 1 for a random map."""
    scale = float(torch.diagonal(matrix).mean())
    eye = torch.eye(matrix.shape[0], dtype=matrix.dtype, device=matrix.device)
    return float((matrix - scale * eye).norm() / matrix.norm().clamp_min(1e-12))


def _haar_orthogonal(size: int, generator: torch.Generator) -> torch.Tensor:
    """A random orthogonal matrix, uniform over the group (QR of a Gaussian, signs fixed)."""
    q, r = torch.linalg.qr(torch.randn(size, size, generator=generator, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()


@torch.no_grad()
def computed_map(model: LoadedModel) -> AlignmentMap:
    """LatentMAS's alignment map of ``model`` (module docstring), cached per model."""
    key = (model.name, "computed")
    with _maps_lock:
        if key in _maps:
            return _maps[key]
    started = time.perf_counter()
    w_in, scale = _input_embeddings(model)
    w_out = model.model.get_output_embeddings().weight
    w_in, w_out = w_in.detach().float(), w_out.detach().float()
    gram = w_out.T @ w_out
    rhs = gram if w_out.data_ptr() == w_in.data_ptr() else w_out.T @ w_in
    gram = gram + RIDGE * torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    matrix = torch.linalg.solve(gram, rhs) * scale  # W_in at the embedding layer's scale
    target_norm = float(w_in.norm(dim=1).mean()) * scale
    alignment = AlignmentMap("computed", matrix.cpu(), target_norm, time.perf_counter() - started,
                             _distance_from_identity(matrix))
    with _maps_lock:
        _maps[key] = alignment
    return alignment


def alignment_map(model: LoadedModel, control: str, seed: int) -> AlignmentMap:
    """The map a control uses: the computed one, the identity, or a random one with its spectrum."""
    computed = computed_map(model)
    if control == "identity_map":
        eye = torch.eye(computed.matrix.shape[0])
        return AlignmentMap("identity", eye, computed.target_norm, 0.0, 0.0)
    if control != "random_map":
        return computed
    key = (model.name, "random", seed)
    with _maps_lock:
        if key in _maps:
            return _maps[key]
    started = time.perf_counter()
    singular = torch.linalg.svdvals(computed.matrix.double()).float()
    generator = torch.Generator().manual_seed(seed)
    left, right = _haar_orthogonal(len(singular), generator), _haar_orthogonal(len(singular), generator)
    matrix = left @ torch.diag(singular) @ right.T
    alignment = AlignmentMap("random", matrix, computed.target_norm, time.perf_counter() - started,
                             _distance_from_identity(matrix))
    with _maps_lock:
        _maps[key] = alignment
    return alignment


def nearest_tokens(model: LoadedModel, vectors: torch.Tensor, count: int = NEAREST) -> list[list[dict]]:
    """Per vector of ``vectors`` ``[n, d]``, the ``count`` tokens whose input embeddings point most
    nearly the way it does (one pass over the embedding table for all of them)."""
    weight, _ = _input_embeddings(model)
    with _maps_lock:
        if model.name not in _row_norms:
            _row_norms[model.name] = weight.detach().float().norm(dim=-1).clamp_min(1e-12)
        norms = _row_norms[model.name]
    vectors = vectors.float().to(weight.device)
    cosines = (vectors @ weight.detach().float().T) / (norms[None] * vectors.norm(dim=-1, keepdim=True).clamp_min(1e-12))
    top = torch.topk(cosines, count, dim=-1)
    decode = model.tokenizer.decode
    return [[{"token": decode([int(i)]), "cosine": float(c)} for c, i in zip(values, indices)]
            for values, indices in zip(top.values, top.indices)]


def shown(token: str) -> str:
    """A token as a label: its text, or its repr when it is only whitespace (' ', '\\n')."""
    return token.strip() or repr(token)


@dataclass
class Thought:
    state: kv.KVState  # the sender's cache: context, then the latent steps
    context_length: int
    steps: list[dict]  # per latent step (module docstring)


@torch.no_grad()
def think(sender: LoadedModel, context_ids: list[int], steps: int, alignment: AlignmentMap,
          timer: StageTimer | None = None) -> Thought:
    """The sender reads the context (timed as ``sharer_prefill``) and runs ``steps`` latent steps
    (``sharer_decode``): each step feeds the aligned final hidden state back as its next input.
    The nearest tokens of each latent vector are looked up afterwards, outside the stages."""
    timer = timer or StageTimer()
    state = kv.KVState()
    with timer.stage("sharer_prefill"):
        next_token, _ = prefill(sender, state, context_ids)
    vectors, raw_norms = [], []
    with timer.stage("sharer_decode"):
        for _ in range(steps):
            vector, raw_norm = alignment.apply(next_token.hidden[0])
            vectors.append(vector)
            raw_norms.append(raw_norm)
            next_token = prefill_vectors(sender, state, vector[None])
    nearest = nearest_tokens(sender, torch.stack(vectors)) if vectors else []
    records = [{
        "step": step,
        "nearest": nearest[step],
        "norm_before_rescale": raw_norm,
        "cosine_to_previous": None if step == 0
        else float(torch.nn.functional.cosine_similarity(vector, vectors[step - 1], dim=0)),
    } for step, (vector, raw_norm) in enumerate(zip(vectors, raw_norms))]
    return Thought(state=state, context_length=len(context_ids), steps=records)


def receiver_state(pair: LoadedPair, thought: Thought) -> kv.KVState:
    """The receiver's starting state: the sender's whole cache in every layer (KVComm's splice)."""
    num_layers = pair.receiver.facts.num_layers
    return kv.splice_prefix(thought.state.cache, num_layers, set(range(num_layers)))


@torch.no_grad()
def attention_mass(receiver: LoadedModel, state: kv.KVState, query_ids: list[int], skip: int) -> list[float]:
    """Per receiver layer, the mean attention mass its question tokens put on the prefix keys from
    index ``skip`` on (kvviz.runtime.attention's capture window). ``state`` is used up: give a fresh one."""
    kwargs = forward_kwargs(receiver, state, len(query_ids), capture=True)
    plan = kwargs["kvviz_plan"]
    plan.capture_skip = skip
    receiver.model.model(input_ids=torch.tensor([query_ids], device=receiver.device), **kwargs)
    return [plan.captured_mass.get(layer, 0.0) for layer in range(receiver.facts.num_layers)]


def layer_records(pair: LoadedPair, thought: Thought | None, query_ids: list[int]) -> list[dict]:
    """Per receiver layer: attention on the latent positions and on the context (None when the
    receiver saw nothing)."""
    num_layers = pair.receiver.facts.num_layers
    if thought is None:
        return [{"layer": layer, "attention_on_latent": None, "attention_on_context": None} for layer in range(num_layers)]
    on_prefix = attention_mass(pair.receiver, receiver_state(pair, thought), query_ids, skip=1)
    if thought.steps:
        on_latent = attention_mass(pair.receiver, receiver_state(pair, thought), query_ids, skip=thought.context_length)
    else:
        on_latent = [0.0] * num_layers
    return [{"layer": layer, "attention_on_latent": on_latent[layer],
             "attention_on_context": on_prefix[layer] - on_latent[layer]} for layer in range(num_layers)]
