"""The operator's view of a p4bs deployment: `p4bs status`, the Grafana dashboards and the
service units (ops/README.md)."""
