"""Event streams: one per island in the store, and the run's figures summarised from them."""
