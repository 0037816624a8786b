"""Entry point of yeto-sky (group ``yeto``, name ``sky``).

Registers nothing yet: its implementations land with their own tests, and
``yeto plugins`` never claims a capability that does not work.
"""
