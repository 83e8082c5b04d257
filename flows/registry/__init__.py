"""The MLflow store and registry: tracking URI, versions, the registry lock and journal,
owner records, store retries."""
