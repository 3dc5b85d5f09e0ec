"""PyramidKV oracle, written from METHODS.md ("PyramidKV"): SnapKV's scores and per-head top-k, with a per-layer
budget that shrinks from the first layer to the last (C = budget, w = window, L layers, T prompt tokens). Nothing
is evicted when T <= C. Two schedules:

* kvpress (the default; "kvpress budget", Python floats, counts include the window): low = C / beta,
  high = 2 C - low; when high >= T - w, high = T - w and low = 2 C - high. If not T >= high >= low >= w, every
  layer keeps round(C) tokens; otherwise layer l keeps round(high - l (high - low) / (L - 1)) (one layer:
  round(high)). Python's round() is half to even. A layer keeps the window plus its top (count - w) prefix tokens.
  C may be fractional (it stands for kvpress's T (1 - r)).
* kvcache_factory ("KVCache-Factory budget", floor division, prefix counts): a uniform C - w while T < 2 (C - w);
  otherwise low = (C - w) // beta, high = 2 (C - w) - low, clipped to high = T - w (then low = 2 (C - w) - high)
  when high >= T - w, and layer l keeps high - l * ((high - low) // (L - 1)) prefix tokens plus the window. One
  layer keeps C - w (our rule: the reference divides by L - 1 = 0)."""
from oracles.snapkv import case_scores, kept_positions


def kvpress_layer_tokens(num_tokens, budget, window, beta, num_layers):
    """kvpress schedule: tokens (window included) each layer keeps."""
    capacity = window + budget  # kept in this form: kvpress subtracts the window back out of it
    low = (capacity - window) / beta
    high = (capacity - window) * 2 - low
    if high >= num_tokens - window:
        high = num_tokens - window
        low = (capacity - window) * 2 - high
    if not (num_tokens >= high >= low >= window):
        return [max(1, round(budget))] * num_layers
    step = (high - low) / (num_layers - 1) if num_layers > 1 else 0.0
    return [round(high - layer * step) for layer in range(num_layers)]


def kvcache_factory_prefix_budgets(num_tokens, budget, window, beta, num_layers):
    """kvcache_factory schedule: prefix tokens (window excluded) each layer keeps."""
    base = budget - window
    if num_tokens < 2 * base or num_layers == 1:
        return [min(base, num_tokens - window)] * num_layers
    low = base // beta
    high = 2 * base - low
    if high >= num_tokens - window:
        high = num_tokens - window
        low = 2 * base - high
    step = (high - low) // (num_layers - 1)
    return [high - layer * step for layer in range(num_layers)]


def layer_prefix_budgets(num_tokens, budget, window, beta, num_layers, schedule="kvpress"):
    if schedule == "kvpress":
        return [min(max(n - window, 0), num_tokens - window)
                for n in kvpress_layer_tokens(num_tokens, budget, window, beta, num_layers)]
    return kvcache_factory_prefix_budgets(num_tokens, budget, window, beta, num_layers)


def pyramidkv_kept(case, budget, window, beta=20, schedule="kvpress", **score_config):
    """[layer][kv_head] kept prompt positions, or None when the prompt is not compressed."""
    if case.prefill_len <= budget:
        return None
    budgets = layer_prefix_budgets(case.prefill_len, budget, window, beta, case.num_layers, schedule)
    return [kept_positions(case_scores(case, layer, window, **score_config), case.prefill_len, window,
                           budgets[layer]) for layer in range(case.num_layers)]
