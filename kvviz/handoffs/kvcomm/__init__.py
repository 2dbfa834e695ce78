"""KVComm: the receiver attends to a same-model sender's KV of the context in selected layers
(``handoff``: the run and its descriptors; ``layers``: which layers, and why, and the options).

Protocol (KVComm, arXiv 2510.03346, and its reference code; REFERENCE.md §2):
1. The sender prefills the context C (its cache, keys after RoPE, positions 0..|C|-1).
2. Calibration, once per pair and calibration sample: the receiver prefills the calibration
   question with the sender's KV of the calibration context present in every layer; for each
   layer, the attention importance S_a(l) is the mean over heads and query tokens of the attention
   mass on the context keys (the first key, the attention sink, excluded).
3. Score S = alpha * minmax(S_a) + (1 - alpha) * minmax(P) with the Gaussian prior
   P(l) = exp(-(l - mu)^2 / (2 sigma^2)); the top M = ceil(r * L) layers are sent (non-contiguous).
   alpha is 1.0 unless set (the reference code's default); ``alpha="paper"`` takes the paper's
   value for the receiver's family (PAPER_ALPHAS; the paper gives none for Gemma).
4. Selected receiver layers see the whole context KV before their own; the others keep only the
   sender's first token as an attention sink. Query positions continue after |C| in every layer,
   and the mask is causal by real positions. ``reference_mask=True`` reproduces the reference
   code's mask instead (query tokens see later query tokens in the unselected layers during the
   prefill; ``kvviz.runtime.attention.AttentionPlan.reference_mask``), so its numbers can be compared.

Calibration sample (``KVCommOptions.calibration``): "builtin" (the sentence below, the same for
every task), "sample" (a given (context, question), e.g. a task's first item as the reference
code does) or "query" (this request itself: the receiver then reads the question twice, once with
the context in every layer to choose the layers, once for real; both passes are on the critical
path and timed as its prefill).

This query's importance: every run also measures S_a(l) of *this* question on *this* context
(one extra receiver pass with the context in every layer, after the answer is written). It is
instrumentation, to show whether one-sample calibration transfers: timed in
``details["query_importance"]["seconds"]``, never in the handoff's stages or first-token time
(except with calibration "query", where that pass is the calibration itself).

Layer 0: with ``always_send_layer0`` (the default, as the reference code does) layer 0 is one of
the M sent layers whenever M >= 1, and the other M - 1 are the best-scoring of layers 1..L-1.
So "exactly M layers" holds in every strategy, and r = 0 sends nothing but the sink.

Strategies (``kvviz.handoffs.kvcomm.layers``, one small pick each over one shared step): "kvcomm"
(the score above), "attention" (alpha = 1), "prior" (alpha = 0), "contiguous" (the best-scoring
block of consecutive layers), "random" (seeded; no score), "explicit" (the layers given; no score).
The options (``KVCommOptions``, ``kvviz.handoffs.kvcomm.options``) live in ``request.options["kvcomm"]``.

Per-layer records (``HandoffResult.layers``, one per receiver layer; plots read these):
  layer                      receiver layer index
  sent                       "context" (the whole context KV) or "sink" (only its first token)
  selected                   sent == "context"
  forced                     True for layer 0 when ``always_send_layer0`` put it in the set (its
                             score was not consulted)
  calibration_attention      S_a(l) measured on the calibration sample; None when the strategy
                             used no attention (prior, random, explicit, or alpha = 0)
  calibration_attention_norm the same, min-max normalised over layers; None likewise
  query_attention            S_a(l) of this question on this context (always measured)
  query_attention_norm       the same, min-max normalised over layers
  prior                      the normalised Gaussian prior, the score's second term (its weight is
                             1 - alpha: 0 by default); None when no score was used
  score                      alpha * calibration_attention_norm + (1 - alpha) * prior, the value
                             the layers were ranked by; None when no score was used (random,
                             explicit)

``details`` keys: strategy, ratio, alpha (None when no score was used), alpha_source, mu, sigma,
selected_layers, num_selected, forced_layers, sink_layers, reference_mask, sender_model,
calibration (None when no attention was used; else source "builtin" | "sample" | "query",
context, query, alpha, seconds, cached), query_importance (seconds, instrumentation),
importance_spearman (Spearman rank correlation between calibration_attention and
query_attention over layers; None without calibration), stopped_by.
"""

from kvviz.handoffs.kvcomm.handoff import HANDOFFS

__all__ = ["HANDOFFS"]
