"""Which strategies ``--dtype auto`` lets multiply in integers (int8 x int8, ``w8a8``) on a CPU
without bf16 instructions: those whose quality held on the development data, on both real
decoders, within what a user would not see (docs/integer-products.md#integer-products-by-strategy).

The bounds, against float products: nDCG@10 (SciFact, QMSum) within 0.005, STS-B Spearman within
0.5 point, and every vector within cosine 0.995. A strategy not admitted keeps float products
under ``auto``, and the build's summary and ``ragidx info`` say why; ``--dtype w8a8`` runs any.
"""

from __future__ import annotations

from ragidx.indexer.model.precision import INTEGER_SPEED_NEEDED

# None yet: every strategy measured moved more than a bound on one real decoder or both
# (docs/integer-products.md#integer-products-by-strategy), so ``auto`` keeps float products and a
# user asks for integer ones with ``--dtype w8a8``.
ADMITTED: frozenset[str] = frozenset()
# Why a measured strategy keeps float products (a clause shown after its name), with ``w8a8`` as
# built (migrated, rotated, one digit): STS-B dev Spearman over all 1,500 pairs (a 200-pair subset's
# difference varies by 0.7 point, more than the bound) and the smallest cosine to float32 over their
# sentences and 8 passages (python -m tests.benchmarks.integer_admission --model M), the first
# model that failed; Gemma 3 only where SmolLM2 kept both bounds, and each model's default.
KEPT_FLOAT: dict[str, str] = {
    "aligned-wva": "a vector moved to cosine 0.9845 on Gemma 3 (bound 0.995)",
    "cot": "STS-B moved -0.56 points on SmolLM2 (bound 0.5), a vector to cosine 0.9843 (bound 0.995)",
    "cp": "a vector moved to cosine 0.9810 on Gemma 3 (bound 0.995), STS-B +0.59 points (bound 0.5)",
    "echo": "SciFact nDCG@10 moved +0.0051 on SmolLM2 (bound 0.005); Gemma 3's and QMSum not measured",
    "htp": "a vector moved to cosine 0.8149 on SmolLM2 (bound 0.995)",
    "knowledge": "a vector moved to cosine 0.9912 on Gemma 3 (bound 0.995)",
    "kv-embedding": (
        "STS-B moved -1.86 points on SmolLM2 (bound 0.5), a vector to cosine 0.9558 (bound 0.995)"
    ),
    "last": "a vector moved to cosine 0.9716 on SmolLM2 (bound 0.995)",
    "mean": "a vector moved to cosine 0.9884 on SmolLM2 (bound 0.995)",
    "prompteol": "a vector moved to cosine 0.9822 on Gemma 3 (bound 0.995), STS-B +0.59 points (bound 0.5)",
    "tp": "a vector moved to cosine 0.9210 on SmolLM2 (bound 0.995)",
    "va": "a vector moved to cosine 0.9734 on SmolLM2 (bound 0.995)",
    "wva": "a vector moved to cosine 0.9870 on SmolLM2 (bound 0.995)",
}
NOT_MEASURED = "not measured with integer products"


def integer_refusal(strategy: str) -> str:
    """Why ``strategy`` keeps float products under ``auto`` ("" where it is admitted)."""
    if strategy in ADMITTED:
        return ""
    return f"{strategy} keeps float products: {KEPT_FLOAT.get(strategy, NOT_MEASURED)}"


def auto_integer_products(run_dtype: str, reason: str, strategy: str, speedup: float) -> tuple[str, str]:
    """``w8a8`` where ``auto`` on a CPU chose float products (float32, float16 or int8 weights),
    ``strategy`` is admitted and integer products measured :data:`INTEGER_SPEED_NEEDED` faster;
    else the dtype chosen, with why integer products were not taken where that is the strategy."""
    if run_dtype not in ("float32", "float16", "int8") or speedup < INTEGER_SPEED_NEEDED:
        return run_dtype, reason
    refusal = integer_refusal(strategy)
    if refusal:
        return run_dtype, "; ".join(part for part in (reason, refusal) if part)
    return "w8a8", f"integer products, {speedup:.1f}x faster here; {strategy} keeps its quality in them"
