"""A token pipeline's figures as ``tracr results show`` prints them (``summary.json`` llm;
what each figure means: :mod:`experiment_design.runtime.generation`)."""

from __future__ import annotations

from typing import Any

from app_api.units import format_bytes


def _ms(v: Any) -> str:
    return "-" if v is None else f"{float(v):.1f} ms"


def _rate(v: Any) -> str:
    return "-" if v is None else f"{float(v):.2f}"


def llm_lines(summary: dict) -> list[str]:
    """The lines of a run's ``llm`` section (none when it has none)."""
    g = summary.get("llm") or {}
    if not g:
        return []
    cuts = "/".join(map(str, g.get("cuts") or [])) or "none (one stage)"
    lines = [
        f"{g.get('model')}: {g.get('sequences')} sequence(s) x {g.get('new_tokens')} tokens "
        f"from a {g.get('prompt_tokens')}-token prompt over {' > '.join(g.get('route') or [])}"
        f", cuts {cuts}, {g.get('in_flight', 1)} in flight",
        f"time to first token {_ms(g.get('ttft_ms'))}; time per output token p50 "
        f"{_ms(g.get('tpot_ms_p50'))}, p90 {_ms(g.get('tpot_ms_p90'))}, p99 "
        f"{_ms(g.get('tpot_ms_p99'))}",
        f"tokens/s {_rate(g.get('tokens_per_s_per_sequence'))} per sequence, "
        f"{_rate(g.get('tokens_per_s_total'))} in total; prefill "
        f"{_rate(g.get('prefill_tokens_per_s'))} tokens/s",
    ]
    for st in g.get("stages") or []:
        layers = st.get("layers") or ["?", "?"]
        sent = st.get("bytes_per_token")
        lines.append(
            f"  {st.get('instance')}: layers {layers[0]}..{layers[1]}, compute "
            f"{_ms(st.get('compute_ms_per_token'))}/token"
            + (f", sends {format_bytes(sent)}/token" if sent is not None else "")
            + (f", weights {format_bytes(st['weight_bytes'])}" if st.get("weight_bytes")
               else "")
            + (f", KV cache {format_bytes(st['kv_cache_bytes_peak'])} at most"
               if st.get("kv_cache_bytes_peak") is not None else ""))
    if g.get("text"):
        lines.append(f"text: {g['text']!r}")
    return lines
