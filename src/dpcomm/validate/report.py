"""The validation report: one table (case, schedule, measured, both predictions, their errors), the
summary statistic (geomean of |error|) and the worst row per prediction, the JSON behind them and the
picture (predicted against measured, the y = x line and +-10% bands). Pure functions of the case records
and the predictions, so a test can build a report from a fixture."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from dpcomm.validate.allreduce import predict_allreduce
from dpcomm.validate.predict import Prediction, predict_case

__all__ = ["HOW", "build_report", "geomean_abs", "markdown", "plot", "summarize", "summary_lines", "table"]

HOW = ("closed", "flow")
"""The two predictions: the closed form with fitted costs, and the flow model on the testbed's links."""
_FLOOR = 1e-4  # |error| below 0.01% counts as 0.01%: a geomean needs no zeros


def geomean_abs(errors: Iterable[float]) -> float | None:
    """The geometric mean of ``|e|`` (each at least 0.01%); None for no errors."""
    logs = [math.log(max(abs(e), _FLOOR)) for e in errors]
    return math.exp(sum(logs) / len(logs)) if logs else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per prediction: rows priced, geomean |error|, the worst row, and the rows beyond 10%."""
    out = {}
    for how in HOW:
        priced = [r for r in rows if r.get(f"err_{how}") is not None]
        worst = max(priced, key=lambda r: abs(r[f"err_{how}"]), default=None)
        out[how] = {
            "rows": len(priced),
            "geomean_abs_error": geomean_abs(r[f"err_{how}"] for r in priced),
            "worst": {"case": worst["case"], "schedule": worst["schedule"], "error": worst[f"err_{how}"]}
            if worst
            else None,
            "over_10pct": sum(abs(r[f"err_{how}"]) > 0.10 for r in priced),
        }
    return out


def build_report(records: list[dict[str, Any]], command: str = "") -> dict[str, Any]:
    """The JSON object of a run: its command, machine, per-case facts, rows and summary."""
    rows: list[dict[str, Any]] = []
    cases = []
    for rec in records:
        many = predict_allreduce if rec["case"].get("algorithms") else predict_case
        preds: list[Prediction] = many(rec)
        rows += [p.to_dict() for p in preds]
        m = rec.get("machine", {})
        cases.append({**rec["case"], "loadavg_before": m.get("loadavg_before"),
                      "loadavg_after": m.get("loadavg_after"), "launch_s": rec.get("launch_s")})  # fmt: skip
    machine = {
        k: v for k, v in (records[0].get("machine", {}) if records else {}).items() if "loadavg" not in k
    }
    return {"command": command, "machine": machine, "cases": cases, "rows": rows, "summary": summarize(rows)}


def _what(case: dict[str, Any]) -> str:
    """A case's model (``resnet20``), or its servers' ranks and loopback (``x2 ranks, lo 400mbit``)."""
    if case.get("algorithms"):
        return f"x{case.get('gpus')} ranks, lo {case.get('intra_rate') or 'unshaped'}"
    if case.get("model"):  # a zoo model's real compute, compiled or not
        return case["model"] + (f" compiled ({case['compile']})" if case.get("compile") else "")
    return case.get("trace", "").split("-cpu")[0]


def _ms(x: float | None) -> str:
    return f"{x * 1e3:.1f}" if x is not None else "-"


def _err(e: float | None) -> str:
    if e is None:
        return "-"
    text = f"{e:+.1%}"
    return f"[red]{text}[/red]" if abs(e) > 0.10 else f"[yellow]{text}[/yellow]" if abs(e) > 0.05 else text


def table(report: dict[str, Any], title: str = "dpcomm validate") -> Any:
    """The rich table: one row per (case, schedule)."""
    from rich.table import Table

    cases = {c["name"]: c for c in report["cases"]}
    t = Table(title=title)
    for col in ("case", "setting", "schedule", "kept", "measured ms", "exposed ms", "closed ms", "error",
                "flow ms", "error"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("case", "setting", "schedule", "kept") else "right")
    last = None
    for r in report["rows"]:
        c = cases.get(r["case"], {})
        setting = f"{c.get('topology')} {c.get('rate')} {_what(c)}"
        extra = [x for x in (c.get("collective"), c.get("mode")) if x not in (None, "native", "overlap")]
        first = r["case"] != last
        last = r["case"]
        t.add_row(
            r["case"] if first else "",
            (setting + (" " + " ".join(extra) if extra else "")) if first else "",
            r["schedule"],
            r["kept"] if r["kept"] != r["schedule"] else "",
            _ms(r["measured_s"]),
            _ms(r["exposed_s"]),
            _ms(r["closed_s"]),
            _err(r["err_closed"]),
            _ms(r["flow_s"]),
            _err(r["err_flow"]),
            end_section=False,
        )
    return t


def summary_lines(report: dict[str, Any]) -> list[str]:
    """One line per prediction: geomean |error| and the worst row."""
    names = {"closed": "closed form (fitted costs)", "flow": "flow model (testbed links)"}
    out = []
    for how in HOW:
        s = report["summary"][how]
        if not s["rows"]:
            out.append(f"{names[how]}: no rows priced")
            continue
        w = s["worst"]
        out.append(
            f"{names[how]}: geomean |error| {s['geomean_abs_error']:.1%} over {s['rows']} rows, worst "
            f"{w['error']:+.1%} ({w['case']} {w['schedule']}), {s['over_10pct']} beyond 10%"
        )
    return out


def plot(report: dict[str, Any], path: str) -> str:
    """Predicted against measured t_iter (both predictions), the y = x line and +-10% bands; PNG/SVG/PDF
    by the suffix, written atomically. Returns the path."""
    import io
    import os

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dpcomm.utils.io import atomic_write_bytes

    fig, ax = plt.subplots(figsize=(6.4, 6.0))
    xs = [r["measured_s"] * 1e3 for r in report["rows"]]
    for how, marker, label in (("closed", "o", "closed form, fitted costs"), ("flow", "x", "flow model")):
        pts = [(r["measured_s"] * 1e3, r[f"{how}_s"] * 1e3) for r in report["rows"] if r[f"{how}_s"]]
        if pts:
            ax.scatter(*zip(*pts, strict=True), marker=marker, label=label, alpha=0.8)
    lo, hi = (min(xs) * 0.8, max(xs) * 1.2) if xs else (1.0, 1000.0)
    line = [lo, hi]
    ax.plot(line, line, color="black", lw=1, label="y = x")
    ax.fill_between(line, [v * 0.9 for v in line], [v * 1.1 for v in line], color="grey", alpha=0.2,
                    label="+-10%")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured t_iter (ms)")
    ax.set_ylabel("predicted t_iter (ms)")
    ax.set_title("dpcomm validate: predicted against measured")
    ax.legend(loc="upper left")
    buf = io.BytesIO()
    fig.savefig(buf, format=os.path.splitext(path)[1].lstrip(".") or "png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


def markdown(report: dict[str, Any]) -> str:
    """The table as Markdown (docs/validate.md), one row per (case, schedule), then the summary lines."""
    cases = {c["name"]: c for c in report["cases"]}
    head = "| case | setting | load | schedule | kept | measured ms | closed ms | error | flow ms | error |"
    lines = [head, "|" + " --- |" * 10]
    last = None
    for r in report["rows"]:
        c = cases.get(r["case"], {})
        extra = [x for x in (c.get("collective"), c.get("mode")) if x not in (None, "native", "overlap")]
        setting = f"`{c.get('topology')}` {c.get('rate')} {_what(c)}"
        setting += "".join(f" {x}" for x in extra)
        first, last = r["case"] != last, r["case"]
        load = (c.get("loadavg_before") or "").split(" ")[0]
        err = [f"{e:+.1%}" if e is not None else "-" for e in (r["err_closed"], r["err_flow"])]
        err = [f"**{e}**" if e != "-" and abs(float(e.rstrip("%"))) > 10 else e for e in err]
        lines.append(
            f"| {r['case'] if first else ''} | {setting if first else ''} | {load if first else ''} | "
            f"`{r['schedule']}` | {r['kept'] if r['kept'] != r['schedule'] else ''} | "
            f"{_ms(r['measured_s'])} | "
            f"{_ms(r['closed_s'])} | {err[0]} | {_ms(r['flow_s'])} | {err[1]} |"
        )
    return "\n".join(lines + [""] + [f"- {s}" for s in summary_lines(report)]) + "\n"
