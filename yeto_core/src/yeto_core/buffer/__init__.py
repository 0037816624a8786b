"""The sample buffer and what reads it: the group codec, the batch reader, the dispenser, fences and the ledger."""
