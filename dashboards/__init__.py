"""Minder's Grafana dashboards as code (grafana-foundation-sdk builders).

Not part of the installed ``minder`` wheel: ``python -m dashboards.build`` writes the committed
JSON of ``dashboards/json``, which Grafana's file provisioning and ``minder dashboards push`` read.
:mod:`dashboards.queries` extracts the panels' PromQL and fills in Grafana's variables, for tests
that run every query against a real Prometheus.
"""
