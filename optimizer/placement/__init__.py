"""Choosing free nodes of a cluster topology for a job (``cluster.topology``)."""
