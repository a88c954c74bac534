"""Render deploy/prometheus/alerts.yml, the one source of the alert and recording rules, as the prometheus-operator
PrometheusRule deploy/k8s/prometheus-operator/prometheusrule.yaml (``make k8s-rules``); ``--check`` fails when
the committed file is not what the rules render to.

    python scripts/k8s_prometheus_rule.py [--check]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE = ROOT / "deploy" / "k8s" / "prometheus-operator" / "prometheusrule.yaml"
HEADER = "# Generated from deploy/prometheus/alerts.yml by `make k8s-rules`: edit the rules there, not here.\n"


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (PromQL, descriptions) as literal blocks, as in the source."""


_Dumper.add_representer(
    str,
    lambda dumper, value: dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None),
)


def render() -> str:
    """The PrometheusRule whose spec is the rule file itself."""
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "calibrated-serving", "labels": {"app.kubernetes.io/name": "calibrated-serving"}},
        "spec": yaml.safe_load(ALERTS.read_text()),
    }
    return HEADER + yaml.dump(rule, Dumper=_Dumper, sort_keys=False, width=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    if parser.parse_args().check:
        if RULE.read_text() != render():
            print(f"{RULE.relative_to(ROOT)} is out of date: run make k8s-rules", file=sys.stderr)
            return 1
        return 0
    RULE.write_text(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
