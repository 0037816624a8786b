"""Entry point of yeto-sglang (group ``yeto``, name ``sglang``).

Registers nothing yet: its implementations land with their own tests, and
``yeto plugins`` never claims a capability that does not work.
"""
