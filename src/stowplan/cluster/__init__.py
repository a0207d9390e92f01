"""Ray: nodes of a live cluster, local fake clusters, realising a plan."""
