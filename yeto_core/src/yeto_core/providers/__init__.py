"""Launching islands: the environment every provider hands an island, and the built-in local provider."""
