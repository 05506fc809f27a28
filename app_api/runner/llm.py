"""What a token pipeline adds to ``summary.json``: the ``llm`` section.

The head's ``generate`` task reports its figures as a configuration row of mode
``generate`` (see :mod:`experiment_design.runtime.generation` for what each means); they
are a run's figures, not a row of ``configs.csv``, so they are taken out of the rows
here and kept for the summary.
"""

from __future__ import annotations

from typing import Any

from experiment_design.tasks.generate import MODE


def take_generations(state: Any, configs: list[dict]) -> list[dict]:
    """Move every generation in ``configs`` into ``state.extra['llm']`` (the first one; a
    later one goes to its ``more`` list); return the other rows."""
    rest = []
    for c in configs:
        if c.get("mode") != MODE:
            rest.append(c)
            continue
        figures = dict(c.get("llm") or {})
        if "llm" not in state.extra:
            state.extra["llm"] = figures
        else:
            state.extra["llm"].setdefault("more", []).append(figures)
    return rest
