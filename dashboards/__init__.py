"""gpumond's Grafana dashboards, built with grafanalib: `python -m dashboards.build` writes the JSON into dashboards/provisioning/."""
