"""torch_xla.debug.metrics_compare_utils: parse metrics reports and flag regressions.

``parse_metrics_report(report)`` turns a :func:`torch_xla.debug.metrics.metrics_report` text into
a flat dict of numbers with keys ``"<Metric>__TotalSamples"``, ``"<Metric>__Accumulator"``,
``"<Metric>__Percentile_<p>"`` (times in seconds, data sizes in bytes, other values as printed)
and ``"<Counter>__Value"``. ``get_data_points_from_metrics_reports(reports)`` gathers those over
several reports (key -> list of values). ``compare_metrics(data_points, metrics, config)`` checks
one parsed report against that history and returns a text listing each key outside its bounds
("" when none).
"""
from __future__ import annotations

import re
import statistics
from typing import Dict, List, Optional

_TIME_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_SIZE_UNITS = {"B": 1.0, "KB": 1024.0, "MB": 1024.0 ** 2, "GB": 1024.0 ** 3, "TB": 1024.0 ** 4, "PB": 1024.0 ** 5}
_TIME_RE = re.compile(r"(\d+(?:\.\d+)?)(d|h|ms|us|ns|m|s)")


def _parse_value(text: str) -> float:
    text = text.strip()
    m = re.fullmatch(r"(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)\s*(B|KB|MB|GB|TB|PB)", text)
    if m:
        return float(m.group(1)) * _SIZE_UNITS[m.group(2)]
    if re.fullmatch(r"(?:\d+(?:\.\d+)?(?:d|h|ms|us|ns|m|s))+", text):
        return sum(float(v) * _TIME_UNITS[u] for v, u in _TIME_RE.findall(text))
    m = re.fullmatch(r"(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)(?:\s*/\s*s(?:econd)?)?", text)
    if m:
        return float(m.group(1))
    raise ValueError(f"cannot parse metric value {text!r}")


def parse_metrics_report(report: str) -> Dict[str, float]:
    """Flat {key: number} of a metrics report (see the module docstring for the keys)."""
    if not isinstance(report, str):
        raise TypeError(f"report must be a str, got {type(report).__name__}")
    out: Dict[str, float] = {}
    name: Optional[str] = None
    kind: Optional[str] = None
    for raw in report.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("Metric:"):
            name, kind = line.split(":", 1)[1].strip(), "metric"
        elif line.startswith("Counter:"):
            name, kind = line.split(":", 1)[1].strip(), "counter"
        elif name is None:
            continue
        elif kind == "counter" and line.startswith("Value:"):
            out[f"{name}__Value"] = float(line.split(":", 1)[1])
        elif kind == "metric" and line.startswith("TotalSamples:"):
            out[f"{name}__TotalSamples"] = float(line.split(":", 1)[1])
        elif kind == "metric" and line.startswith("Accumulator:"):
            out[f"{name}__Accumulator"] = _parse_value(line.split(":", 1)[1])
        elif kind == "metric" and line.startswith("Percentiles:"):
            for part in line.split(":", 1)[1].split(";"):
                if "=" not in part:
                    continue
                pct, value = part.split("=", 1)
                out[f"{name}__Percentile_{pct.strip().rstrip('%')}"] = _parse_value(value)
    return out


def get_data_points_from_metrics_reports(metrics_reports: List[str]) -> Dict[str, List[float]]:
    """{key: [value in report 0, report 1, ...]} over several reports (missing keys skipped)."""
    points: Dict[str, List[float]] = {}
    for report in metrics_reports:
        for key, value in parse_metrics_report(report).items():
            points.setdefault(key, []).append(value)
    return points


def compare_metrics(data_points: Dict[str, List[float]], metrics: Dict[str, float],
                    config: Optional[Dict] = None) -> str:
    """Report of the keys of ``metrics`` outside their bounds given the history ``data_points``.

    ``config`` maps a key (or ``"default"``) to ``{"base_expression": "v <= v_mean + (v_stddev * 3.0)"}``
    style rules: a Python expression over ``v`` (the new value), ``v_mean``, ``v_stddev``,
    ``v_min``, ``v_max`` that must hold. Without a rule a key is not checked.
    """
    config = config or {}
    lines = []
    for key in sorted(metrics):
        rule = config.get(key, config.get("default"))
        if not rule:
            continue
        expr = rule.get("base_expression") if isinstance(rule, dict) else rule
        history = data_points.get(key) or []
        if not history:
            continue
        env = {"v": metrics[key], "v_mean": statistics.fmean(history),
               "v_stddev": statistics.pstdev(history) if len(history) > 1 else 0.0,
               "v_min": min(history), "v_max": max(history)}
        if not eval(expr, {"__builtins__": {}}, env):  # expressions come from the caller's config
            lines.append(f"{key} failed its expression check. Expression: {expr}. Mean: {env['v_mean']}. "
                         f"Stddev: {env['v_stddev']}. Actual value: {metrics[key]}")
    return "\n".join(lines) + ("\n" if lines else "")
