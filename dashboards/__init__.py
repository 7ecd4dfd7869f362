"""Minder's Grafana dashboards: as code, as shipped JSON, and the client that pushes them.

``python -m dashboards.build`` writes the committed JSON of ``dashboards/json`` from the
grafana-foundation-sdk builders (``fleet``, ``job``, ``whatif``, ``service``, ``agents``: a
development tool, the ``dev`` extra). The JSON is package data of the wheel and the image:
:mod:`dashboards.bundle` reads it back (``minder dashboards list``), :mod:`dashboards.grafana`
pushes it into Grafana (``minder dashboards push``, the ``grafana`` extra), and Grafana's file
provisioning mounts it. :mod:`dashboards.queries` extracts the panels' PromQL and fills in
Grafana's variables, for tests that run every query against a real Prometheus.
"""
