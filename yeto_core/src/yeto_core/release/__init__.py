"""Policy releases: the release store, deltas, delta parents and HF exports."""
