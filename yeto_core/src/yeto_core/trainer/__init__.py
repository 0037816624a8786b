"""The trainer side: the trainer loop, its lifecycle (driver and remote), consistent cuts and the S1 scheduler."""
