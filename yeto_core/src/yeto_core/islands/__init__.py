"""The island process: ``python -m yeto_core.islands.main`` runs a sampler or trainer island."""
