"""torch_xla.debug.metrics_compare_utils: parse metrics reports and flag regressions.

Follows upstream PyTorch/XLA's contract (written here from its documented behaviour):

``parse_metrics_report(report, dehumanize=True)`` turns a
:func:`torch_xla.debug.metrics.metrics_report` text into a flat dict. Keys:

* ``"<Metric>__TotalSamples"`` (float),
* ``"<Metric>__Accumulator<unit>"`` and ``"<Metric>__Percentile_<p><unit>"`` where ``<unit>`` is
  ``"_sec"`` for durations (``01m02s003ms4.5us`` -> seconds), ``"_mb"`` for data sizes
  (``1.54MB`` -> megabytes, decimal: 1 KB = 1e-3 MB) and empty for plain numbers,
* ``"<Counter>__Value"`` (int).

With ``dehumanize=False`` each value is a ``(number, original_text)`` pair.

``get_data_points_from_metrics_reports(reports)`` -> ``{key: [value in report 0, 1, ...]}`` with
``None`` where a report lacks the key.

``compare_metrics(data_points, metrics_report, config=...)`` parses ``metrics_report`` (the report
string) and checks each key against the mean / population stddev of its history in
``data_points``. Returns one line per failing key, or ``""``. Two config styles are accepted:

* upstream's current one: ``{'base_expression': 'v <= v_mean + (v_stddev * 2.0)',
  '<key>_expression': '...'}`` (Python expressions over ``v``, ``v_mean``, ``v_stddev``);
  the default config is ``{'base_expression': 'v <= v_mean + (v_stddev * 2.0)'}``;
* upstream's earlier one: ``{'base_tolerance': 2.0, '<key>_tolerance': 10.0}`` (``v`` must lie
  within ``v_mean +- v_stddev * tolerance``).

A per-key entry wins over a base entry; a key whose history is missing is skipped, except new
``aten::`` counters, which are reported as ``Found new aten counter: ...`` (new CPU fallbacks).
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Dict, List, Optional

_DEFAULT_CONFIG = {"base_expression": "v <= v_mean + (v_stddev * 2.0)"}

_TIME_RE = re.compile(
    r"(?:(?P<d>\d+)d)?(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m(?!s))?(?:(?P<s>\d+)s)?(?:(?P<ms>\d+)ms)?"
    r"(?:(?P<us>[\d.]+)us)?", re.IGNORECASE)
_TIME_SCALE = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
_SIZE_RE = re.compile(
    r"(?:(?P<PB>[\d.]+)PB)?(?:(?P<TB>[\d.]+)TB)?(?:(?P<GB>[\d.]+)GB)?(?:(?P<MB>[\d.]+)MB)?"
    r"(?:(?P<KB>[\d.]+)KB)?(?:(?P<B>[\d.]+)B)?", re.IGNORECASE)
_SIZE_SCALE = {"PB": 1e9, "TB": 1e6, "GB": 1e3, "MB": 1.0, "KB": 1e-3, "B": 1e-6}  # -> MB
_HEADER_RE = re.compile(r"^\s*(Metric|Counter):\s*(\S+)\s*$")
_FIELD_RE = re.compile(r"^\s*(TotalSamples|Accumulator|Value|Percentiles):\s*(.*?)\s*$")
_UPSTREAM_PERCENTILES = ("1", "5", "10", "20", "50", "80", "90", "95", "99")
_SERVER_PERCENTILES = ("25", "50", "80", "90", "95", "99")


def _scaled(regex, scale, text):
    m = regex.match(text)
    if m is None or not any(m.groups()):
        return None
    return sum(float(v) * scale[k] for k, v in m.groupdict().items() if v is not None)


def _to_number(text: str):
    """(value, unit) of one report value: plain number (''), duration ('sec') or size ('mb')."""
    try:
        return float(text), ""
    except ValueError:
        pass
    v = _scaled(_TIME_RE, _TIME_SCALE, text)
    if v is not None:
        return v, "sec"
    v = _scaled(_SIZE_RE, _SIZE_SCALE, text)
    if v is not None:
        return v, "mb"
    raise ValueError(f"Unknown metric_str format: {text}")


def parse_metrics_report(report, dehumanize=True):
    """Flat {key: value} of a metrics report string (see the module docstring for the keys)."""
    if not isinstance(report, str):
        raise TypeError(f"parse_metrics_report: report must be a str (met.metrics_report()), "
                        f"got {type(report).__name__}")
    metrics: Dict[str, dict] = {}
    counters: Dict[str, int] = {}
    name = kind = None
    for line in report.splitlines():
        h = _HEADER_RE.match(line)
        if h:
            kind, name = h.group(1), h.group(2)
            continue
        f = _FIELD_RE.match(line)
        if not f or name is None:
            if line.strip() and not line[:1].isspace():
                name = kind = None  # unindented text ends the entry
            continue
        field, text = f.groups()
        if kind == "Counter" and field == "Value" and re.fullmatch(r"\d+", text):
            counters[name] = int(text)
        elif kind == "Metric" and field in ("TotalSamples", "Accumulator", "Percentiles"):
            metrics.setdefault(name, {})[field] = text
    points = {}
    for mname, fields in metrics.items():
        # As upstream: a metric counts when it has TotalSamples, Accumulator and its percentiles.
        if "TotalSamples" not in fields or "Accumulator" not in fields or "Percentiles" not in fields:
            continue
        if not re.fullmatch(r"\d+", fields["TotalSamples"]):
            continue
        pcts = []
        for part in fields["Percentiles"].split(";"):
            if "=" in part:
                p, v = part.split("=", 1)
                pcts.append((p.strip().rstrip("%"), v.strip()))
        got = tuple(p for p, _ in pcts)
        if got[:len(_UPSTREAM_PERCENTILES)] == _UPSTREAM_PERCENTILES:
            pcts = pcts[:len(_UPSTREAM_PERCENTILES)]
        elif got[:len(_SERVER_PERCENTILES)] == _SERVER_PERCENTILES:
            # upstream files a server report's 25th percentile under Percentile_20
            pcts = [("20" if p == "25" else p, v) for p, v in pcts[:len(_SERVER_PERCENTILES)]]
        else:
            continue
        entries = [("TotalSamples", fields["TotalSamples"]), ("Accumulator", fields["Accumulator"])]
        entries += [(f"Percentile_{p}", v) for p, v in pcts]
        for field, text in entries:
            value, unit = _to_number(text)
            key = f"{mname}__{field}{'_' + unit if unit else ''}"
            points[key] = value if dehumanize else (value, text)
    for cname, value in counters.items():
        points[f"{cname}__Value"] = value
    return points


def get_data_points_from_metrics_reports(metrics_reports):
    """{key: [value from report 0, report 1, ...]}; None where a report lacks the key."""
    if isinstance(metrics_reports, (str, bytes)) or not isinstance(metrics_reports, (list, tuple)):
        raise TypeError("get_data_points_from_metrics_reports: metrics_reports must be a list of report "
                        f"strings, got {type(metrics_reports).__name__}")
    n = len(metrics_reports)
    points: Dict[str, List] = {}
    for i, report in enumerate(metrics_reports):
        for key, value in parse_metrics_report(report).items():
            points.setdefault(key, [None] * n)[i] = value
    return points


def _aggregates(values):
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return None
    mean = sum(vals) / len(vals)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))


def compare_metrics(data_points, metrics_report, config=None):
    """Lines for each key of ``metrics_report`` (a report string) outside its history's bounds."""
    if not isinstance(data_points, Mapping):
        raise TypeError("compare_metrics: data_points must be a dict (the output of "
                        f"get_data_points_from_metrics_reports), got {type(data_points).__name__}")
    if not isinstance(metrics_report, str):
        raise TypeError("compare_metrics: metrics_report must be the report string "
                        f"(met.metrics_report()), got {type(metrics_report).__name__}")
    if config is None:
        config = _DEFAULT_CONFIG
    if not isinstance(config, Mapping):
        raise TypeError(f"compare_metrics: config must be a dict, got {type(config).__name__}")
    for key, history in data_points.items():
        if isinstance(history, (str, bytes)) or not isinstance(history, (list, tuple)):
            raise TypeError(f"compare_metrics: data_points[{key!r}] must be a list of values, "
                            f"got {type(history).__name__}")
    parsed = parse_metrics_report(metrics_report)
    report = ""
    for key, v in sorted(parsed.items()):
        agg = _aggregates(data_points[key]) if key in data_points else None
        if agg is None:
            if key.startswith("aten::"):  # a new CPU fallback
                report += f"Found new aten counter: {key}: {v}\n"
            continue
        v_mean, v_stddev = agg
        rule = None
        for ck, style in ((f"{key}_expression", "expr"), (f"{key}_tolerance", "tol"),
                          ("base_expression", "expr"), ("base_tolerance", "tol")):
            if ck in config:
                rule = (style, config[ck])
                break
        if rule is None:
            raise KeyError("compare_metrics: config needs 'base_expression' (or 'base_tolerance')")
        style, arg = rule
        if style == "expr":
            if not isinstance(arg, str):
                raise TypeError(f"compare_metrics: expression for {key} must be a str, got {type(arg).__name__}")
            ok = eval(arg, {"__builtins__": {}}, {"v": v, "v_mean": v_mean, "v_stddev": v_stddev})
            if ok == False:  # noqa: E712 (as upstream: only an explicit False fails)
                report += (f"{key} failed its expression check. Expression: {arg}.  Mean: {v_mean}.  "
                           f"Stddev: {v_stddev}.  Actual Value: {v}\n")
        else:
            if isinstance(arg, bool) or not isinstance(arg, (int, float)):
                raise TypeError(f"compare_metrics: tolerance for {key} must be a number, got {type(arg).__name__}")
            lower, upper = v_mean - v_stddev * arg, v_mean + v_stddev * arg
            if v < lower or v > upper:
                report += (f"{key} is outside the expected range using tolerance: {arg}. "
                           f"Lower limit: {lower}  Upper limit: {upper}  Actual Value: {v}\n")
    return report
