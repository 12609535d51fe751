"""`p4bs dashboard`: the project's own web view of a deployment (ops/README.md).

- `feed`: one Kafka reader per server keeps the fleet's state in memory (links, their newest
  window, decisions, open alerts, optimizer states) and fans new records out to the pages;
- `link_history`: a link's time series from InfluxDB, with the Grafana link dashboard's queries;
- `search`: a P4BS link's Bayesian search (observations, the GP's posterior, EI);
- `server`: the Starlette app, its pages and JSON API, authentication and the server's start.
"""
