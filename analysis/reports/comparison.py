"""The cluster comparison as people read it: one line per cluster (rows as ``compare`` returns
them, or read back from ``compare.csv``)."""

from __future__ import annotations

from clustersim.analysis.tables import render


def table(rows: list[dict]) -> str:
    terms = dict.fromkeys(t for r in rows if isinstance(t := r.get("price_terms"), str) and t)
    return render(*table_rows(rows), title="Cluster comparison") + "".join(
        f"\nprice: {t}" for t in terms)


def table_rows(rows: list[dict]) -> tuple[list[str], list[list]]:
    """Headers and lines of the comparison as users read it (rows as returned by
    :func:`compare`, or read back from compare.csv)."""
    def text(value) -> str:
        return value if isinstance(value, str) else ""

    currency = next((text(r.get("currency")) for r in rows if text(r.get("currency"))), "")
    headers = ["config", "gpu", "GPUs", "per node", "NICs", "oversub", "strategy", "tokens/s",
               "MFU", "peak GiB", "goodput tok/s", "J/token"]
    if currency:
        headers.append(f"{currency}/Mtok")
    shared = any(r.get("lost_fraction") not in (None, "") for r in rows)
    if shared:
        headers.append("lost to others")
    noted = any(text(r.get("problem")) for r in rows)
    if noted:
        headers.append("note")
    out = []
    for r in rows:
        if text(r.get("problem")):
            out.append([r["name"], *["-"] * (len(headers) - 2), f"not run: {r['problem']}"])
            continue
        n = {k: int(r[k]) for k in ("tp", "pp", "dp", "cp", "micro_batch", "zero", "num_gpus",
                                    "gpus_per_node", "nics_per_node")}
        strategy = (f"TP{n['tp']} PP{n['pp']} DP{n['dp']}" + (f" CP{n['cp']}" if n["cp"] > 1 else "")
                    + f" mb{n['micro_batch']} {r['recompute']} Z{n['zero']}")
        line = [r["name"], r["gpu"], n["num_gpus"], n["gpus_per_node"], n["nics_per_node"],
                f"{r['oversubscription']:g}", strategy, f"{r['tokens_per_s']:,.0f}",
                f"{100 * r['mfu']:.1f}%", f"{r['peak_memory_gib']:.1f}",
                f"{r['goodput_tokens_per_s']:,.0f}", f"{r['energy_per_token_j']:.3g}"]
        if currency:
            cost = r["cost_per_million_tokens"]
            line.append("-" if cost is None or cost != cost else f"{cost:.3g}")
        if shared:
            lost = r.get("lost_fraction")
            line.append("-" if lost in (None, "") else f"{100 * float(lost):+.1f}%")
        out.append(line + [""] * noted)
    return headers, out


