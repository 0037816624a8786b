"""The head: the run's process that launches islands, holds the lease, runs S1 and the breakers, and reports."""
