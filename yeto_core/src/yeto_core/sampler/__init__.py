"""The sampler side: the sampler loop, its room and drain, the policy follower, fingerprints, engine servers."""
