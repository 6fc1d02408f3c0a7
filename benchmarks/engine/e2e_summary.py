"""What benchmarks/engine/e2e.py prints at its end, and the busy-node summary it adds to its JSON
(the measures issue 35 judges: busy_rules.py and the page read them)."""
from __future__ import annotations


def print_results(results: dict) -> None:
    print("| model | phase | variant | ms / step | tokens/s | vs hbm |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for name, model in results["models"].items():
        for part in (model, model.get("busy", {})):
            for phase in ("decode", "prefill"):
                for variant, e in part.get(phase, {}).items():
                    loss = "" if e["loss_vs_hbm"] is None else f"{e['loss_vs_hbm'] * 100:+.1f}%"
                    print(f"| {name} | {phase} | {variant} | {e['ms']:.3f} | {e['tokens_per_s']:,.0f} | {loss} |")
    for name, model in results["models"].items():
        if model.get("busy"):
            summary = busy_summary(model)
            model["busy_summary"] = summary
            print(f"\n{name}, beside {model['busy']['neighbours']} busy neighbours (daemon: {results['daemon_args'] or 'defaults'}"
                  f"{', decode_path ' + results['decode_path'] if results.get('decode_path') else ''}): "
                  + ", ".join(f"{key} {value}" for key, value in summary.items()))


def busy_summary(model: dict) -> dict:
    """The issue's measures of one model: the decode step (median, p90) alone and beside the
    neighbours, their ratios, a lone decode lookup's p90 against its p90 alone, the neighbours' rows/s
    over their whole run and while the rank decodes."""
    alone, busy = model["decode"]["host"], model["busy"]["decode"]["host+busy"]
    lookup_alone, lookup_busy = model["busy"]["lookup_alone"], model["busy"]["lookup_busy"]
    rates = [r["m_rows_per_s"] for r in model["busy"]["neighbour_reports"]]
    return {"step_alone_ms": round(alone["step_median_ms"], 3), "step_alone_p90_ms": round(alone["step_p90_ms"], 3),
            "step_busy_ms": round(busy["step_median_ms"], 3), "step_busy_p90_ms": round(busy["step_p90_ms"], 3),
            "median_x": round(busy["step_median_ms"] / alone["step_median_ms"], 3),
            "p90_x_median_alone": round(busy["step_p90_ms"] / alone["step_median_ms"], 3),
            "lookup_p90_x": round(lookup_busy["p90_ms"] / lookup_alone["p90_ms"], 2),
            "lookup_alone_p90_ms": round(lookup_alone["p90_ms"], 3), "lookup_busy_p90_ms": round(lookup_busy["p90_ms"], 3),
            "neighbours_m_rows_per_s": round(sum(rates), 2), "each_neighbour": rates,
            "neighbours_decoding_m_rows_per_s": decoding_m_rows_per_s(model["busy"]),
            "neighbours_cores_while_decoding": model["busy"].get("neighbour_cores_while_decoding")}


def decoding_m_rows_per_s(busy: dict) -> float | None:
    """The neighbours' M rows/s in all within the host path's decode runs beside them (None for a run
    that recorded no windows: its results predate them)."""
    rates = [r.get("m_rows_per_s_within") for r in busy["neighbour_reports"]]
    return None if not rates or None in rates else round(sum(rates), 2)
