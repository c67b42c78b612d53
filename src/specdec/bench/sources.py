"""Per draft source: how many nodes each offered, how many were accepted, and its share of accepted tokens.

Why: LogitSpec builds one tree from several sources (prompt lookup's chain, its
own root retrieval, next-next candidates, third-level guesses, recycled
successors, the session store, a datastore). Whether a source earns its nodes
is a measured question, so a proposer that exposes `source_stats`
({source: {"offered": n, "accepted": n}}, counted over its lifetime) has the
difference over each generation recorded in that run's row
(`source_counts`), and the report sums them per method.

Invariants: counts come only from the proposer's own bookkeeping (nodes it put
in verified trees, nodes on accepted paths), never estimated; a method without
`source_stats` has `source_counts` None and no row in the table; shares are of
accepted draft tokens (bonus and recovered tokens belong to no source).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Counts = dict[str, dict[str, int]]


def snapshot(proposer: Any) -> Counts | None:
    """A copy of the proposer's per-source counts, or None when it keeps none."""
    stats = getattr(proposer, "source_stats", None)  # any object: proposers outside the registry too
    if not isinstance(stats, Mapping):
        return None
    return {source: dict(counts) for source, counts in stats.items()}


def difference(before: Counts | None, after: Counts | None) -> Counts | None:
    """Counts added between two snapshots (sources that offered nothing left out)."""
    if before is None or after is None:
        return None
    out: Counts = {}
    for source, counts in after.items():
        old = before.get(source, {})
        delta = {key: counts.get(key, 0) - old.get(key, 0) for key in ("offered", "accepted")}
        if delta["offered"]:
            out[source] = delta
    return out


def source_table(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """method -> source -> offered, accepted, acceptance (accepted / offered), share of accepted tokens."""
    totals: dict[str, Counts] = {}
    for row in rows:
        counts = row.get("source_counts")
        if not counts:
            continue
        method = totals.setdefault(str(row["method"]), {})
        for source, c in counts.items():
            entry = method.setdefault(source, {"offered": 0, "accepted": 0})
            entry["offered"] += int(c.get("offered", 0))
            entry["accepted"] += int(c.get("accepted", 0))
    table: dict[str, dict[str, dict[str, float]]] = {}
    for method, sources in totals.items():
        accepted = sum(c["accepted"] for c in sources.values())
        table[method] = {
            source: {
                "offered": c["offered"],
                "accepted": c["accepted"],
                "acceptance": c["accepted"] / c["offered"] if c["offered"] else 0.0,
                "share": c["accepted"] / accepted if accepted else 0.0,
            }
            for source, c in sorted(sources.items(), key=lambda item: -item[1]["accepted"])
        }
    return table


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """A markdown section of `source_table` ("" when no method kept counts)."""
    table = source_table(rows)
    if not table:
        return ""
    lines = [
        "\n## Draft sources\n",
        "Nodes each source put in verified trees, how many were accepted, and its share of accepted draft tokens.\n",
        "| method | source | offered | accepted | acceptance | share of accepted |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for method, sources in table.items():
        for source, c in sources.items():
            lines.append(
                f"| `{method}` | {source} | {c['offered']:.0f} | {c['accepted']:.0f} "
                f"| {100 * c['acceptance']:.1f}% | {100 * c['share']:.1f}% |"
            )
    return "\n".join(lines) + "\n"
