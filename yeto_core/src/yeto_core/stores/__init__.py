"""Object store implementations that ship with yeto-core."""
